"""Which addresses only the worker's own host can reach (``radix_global/endpoints.py``)."""

from __future__ import annotations

import pytest

from radix_global.endpoints import is_host_local
from radix_global.registration import RegistrationError, WorkerInfo, refuse_host_local


@pytest.mark.parametrize("address", [
    "http://127.0.0.1:30000", "http://127.8.9.1:1", "http://[::1]:30000", "http://localhost:1",
    "http://0.0.0.0:30000", "tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557",
    "tcp://127.0.0.1:5557", "ipc:///tmp/kv", "inproc://kv", "http://LOCALHOST:1",
    "http://app.localhost:1",
    # spellings the C resolver takes for loopback / any: a check on dotted quads alone misses
    "http://127.1:1", "http://0:1", "http://2130706433:1", "http://0x7f000001:1",
    "http://0177.0.0.1:1", "http://[::ffff:127.0.0.1]:1", "http://[::ffff:0.0.0.0]:1",
    "http://localhost.:1", "http://127.0.0.1.:1", "http://localhost6:1", "tcp://127.1:5557",
])
def test_host_local(address):
    assert is_host_local(address)


@pytest.mark.parametrize("address", [
    "http://10.77.0.2:30000", "tcp://10.77.0.2:5557", "tcp://[fd00::2]:5557",
    "http://worker-3.cluster.internal:30000", "tcp://192.168.1.4:1", "not a url",
    "http://10:1",  # inet_aton: 0.0.0.10
])
def test_reachable_from_elsewhere(address):
    assert not is_host_local(address)


def test_a_remote_registration_names_the_field_and_the_fix():
    def info(**kw: str) -> WorkerInfo:
        return WorkerInfo(worker_id="w", url=kw.get("url", "http://10.0.0.2:1"), model="m",
                          namespace="m@1", page_size=4,
                          kv_events_replay_endpoint=kw.get("replay"))

    refuse_host_local(info())
    with pytest.raises(RegistrationError,
                       match=r"kv_events_replay_endpoint.*--radix-global-advertise-host"):
        refuse_host_local(info(replay="tcp://127.0.0.1:5558"))
    with pytest.raises(RegistrationError, match="url"):
        refuse_host_local(info(url="http://0.0.0.0:1"))


def test_grpc_peers_on_this_host():
    from radix_global.service_guard import is_loopback_peer

    for peer in ("ipv4:127.0.0.1:5000", "ipv4:127.0.0.2:1", "ipv6:[::1]:5000",
                 "ipv6:[::ffff:127.0.0.1]:5000", "unix:/tmp/s"):
        assert is_loopback_peer(peer), peer
    for peer in ("ipv4:10.77.0.2:5000", "ipv6:[fd00::2]:5000", "ipv6:[::ffff:10.0.0.1]:1"):
        assert not is_loopback_peer(peer), peer
