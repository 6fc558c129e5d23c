"""sglang_patch/pool/copy_orders.py: the backend fetches the router's copy orders, hands the
well-formed ones of its namespace on, and never lets a bad answer or a lost router reach
SGLang's threads."""

from __future__ import annotations

import httpx

from sglang_patch.pool.copy_orders import Answer, CopyOrders, http_fetch, valid_keys

KEY = "ab" * 32


def test_only_well_formed_orders_of_this_namespace_are_carried_out() -> None:
    handled: list[list[str]] = []
    orders = [{"namespace": "m@1", "keys": [KEY, KEY]}, {"namespace": "other@1", "keys": [KEY]},
              {"namespace": "m@1", "keys": ["AB" * 32]}, {"namespace": "m@1", "keys": []},
              "nonsense", {"namespace": "m@1"}]
    poller = CopyOrders("m@1", lambda: Answer(orders, []),
                        lambda keys: handled.append(keys) or len(keys), interval_s=3600)
    assert poller.poll() == 2 and handled == [[KEY, KEY]]
    assert poller.malformed == 4 and poller.copied == 2
    poller.close()
    assert valid_keys({"namespace": "m@1", "keys": [KEY]}, "m@1") == [KEY]


def test_a_failing_order_or_a_strange_answer_costs_only_itself() -> None:
    calls: list[list[str]] = []

    def handle(keys: list[str]) -> int:
        calls.append(keys)
        if len(calls) == 1:
            raise RuntimeError("the store broke")
        return len(keys)

    orders = [{"namespace": "m@1", "keys": [KEY]}, {"namespace": "m@1", "keys": [KEY, KEY]}]
    poller = CopyOrders("m@1", lambda: Answer(orders, []), handle, interval_s=3600)
    assert poller.poll() == 2 and poller.failed == 1  # the second order still ran
    poller.close()

    def not_an_object(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=["nonsense"])

    fetch = http_fetch("http://r:1", "p", None, transport=httpx.MockTransport(not_an_object))
    assert fetch() == Answer([], [])


def test_every_router_is_asked_and_only_all_failing_is_a_failure() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1":
            raise httpx.ConnectError("down")
        return httpx.Response(200, json={"orders": [{"namespace": "m@1", "keys": [KEY]}]})

    fetch = http_fetch("http://r1:1,http://r2:1,http://r3:1", "p", None,
                       transport=httpx.MockTransport(handler))
    assert len(fetch().orders) == 2  # r2's and r3's: the leader need not be the first

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("down")

    poller = CopyOrders("m@1", http_fetch("http://r1:1,http://r2:1", "p", None,
                                          transport=httpx.MockTransport(down)),
                        lambda keys: 1, interval_s=3600)
    assert poller.poll() == 0 and poller.failed == 1
    poller.close()


def test_a_lost_router_costs_the_round_only_and_the_fetch_asks_by_pool_id() -> None:
    def down() -> Answer:
        raise httpx.ConnectError("no router")

    poller = CopyOrders("m@1", down, lambda keys: 1, interval_s=3600)
    assert poller.poll() == 0 and poller.failed == 1
    poller.close()
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"orders": [{"namespace": "m@1", "keys": [KEY]}]})

    fetch = http_fetch("http://r:1", "mooncake-m@h:1", "tok",
                       transport=httpx.MockTransport(handler))
    assert fetch().orders == [{"namespace": "m@1", "keys": [KEY]}]
    assert seen[0].url.params["pool_id"] == "mooncake-m@h:1"
    assert seen[0].headers["authorization"] == "Bearer tok"


def test_a_router_that_does_not_know_the_worker_yet_has_no_orders_and_is_no_failure() -> None:
    """The backend polls from its start, before the wrapper registers (and again after a router
    restart): the router's 404 for an unknown pool is an empty answer, not a warning."""
    fetch = http_fetch("http://r:1", "p", None, transport=httpx.MockTransport(
        lambda request: httpx.Response(404, json={"error": "no registered worker"})))
    assert fetch() == Answer([], [])
    poller = CopyOrders("m@1", fetch, lambda keys: len(keys), interval_s=3600)
    assert poller.poll() == 0 and poller.failed == 0
    poller.close()


def test_the_routers_lost_hosts_reach_the_pool_every_round() -> None:
    """Each router's ``lost_hosts``, together; a bad list is ignored, not fatal."""
    answers = {"r1": {"orders": [], "lost_hosts": ["10.0.0.3"]},
               "r2": {"orders": [], "lost_hosts": ["10.0.0.4", 7]},
               "r3": {"orders": [], "lost_hosts": "10.0.0.9"}}
    fetch = http_fetch("http://r1:1,http://r2:1,http://r3:1", "p", None,
                       transport=httpx.MockTransport(
                           lambda request: httpx.Response(200, json=answers[request.url.host])))
    told: list[list[str]] = []
    poller = CopyOrders("m@1", fetch, lambda keys: 1, interval_s=3600, on_lost=told.append)
    poller.poll()
    answers["r1"]["lost_hosts"] = []
    poller.poll()
    poller.close()
    assert told == [["10.0.0.3", "10.0.0.4"], ["10.0.0.4"]]


def test_a_poller_without_a_handler_only_hears_the_lost_hosts():
    """A tensor-parallel rank that copies nothing still skips the hosts the routers know lost
    (it reads its own shard's pages); the orders are not its to carry out."""
    told: list[list[str]] = []
    order = {"namespace": "m@1", "keys": ["0" * 64]}
    poller = CopyOrders("m@1", lambda: Answer([order, "junk"], ["10.0.0.3"]), None,
                        interval_s=3600, on_lost=told.append)
    assert poller.poll() == 0
    poller.close()
    assert told == [["10.0.0.3"]] and poller.malformed == 0 and poller.copied == 0


def test_a_listener_asks_the_routers_to_keep_the_orders():
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.params.get("orders"))
        return httpx.Response(200, json={"orders": [], "lost_hosts": []})

    for orders in (True, False):
        http_fetch("http://r1:1", "p", None, transport=httpx.MockTransport(answer),
                   orders=orders)()
    assert seen == ["1", "0"]
