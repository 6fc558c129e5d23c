"""Pure flag planning of `radix-global sglang` (no processes)."""

from __future__ import annotations

import collections
import json
import socket

import msgspec
import pytest

from radix_global.registration import RegistrationError
from radix_global.types import Role
from sglang_patch.launch_args import parse_sglang
from sglang_patch.launch_plan import LaunchError, build_plan

BASE = ["--model-path", "/m", "--port", "31000", "--device", "cpu", "--page-size", "4"]


def given(argv, dest):
    """What SGLang's own parser reads from ``argv`` (None: not given); it also checks that
    the planned command line is one SGLang accepts."""
    return parse_sglang(argv).given.get(dest)


def extra_config(plan):
    return json.loads(given(plan.sglang_argv, "hicache_storage_backend_extra_config"))


def test_joins_cluster_with_events_pool_and_cpu_hicache():
    plan = build_plan([*BASE, "--radix-global", "http://127.0.0.1:9000",
                       "--radix-global-pool-id", "p1",
                       "--hicache-storage-prefetch-policy", "wait_complete"],
                      ports=(5001, 5002, 5003), default_namespace="m@abc")
    argv = plan.sglang_argv
    assert "--radix-global" not in argv and "--radix-global-pool-id" not in argv
    assert given(argv, "hicache_storage_prefetch_policy") == "wait_complete"  # passthrough
    assert "--enable-hierarchical-cache" in argv
    assert given(argv, "enable_cache_report") is True  # OpenAI answers report cached tokens
    assert given(argv, "hicache_write_policy") == "write_through"
    assert given(argv, "hicache_storage_backend") == "dynamic"
    assert given(argv, "hicache_io_backend") == "direct"
    assert given(argv, "hicache_mem_layout") == "layer_first"
    events = json.loads(given(argv, "kv_events_config"))
    assert events == {"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5001", "bind": True,
                      "topic": "kv-events", "replay_endpoint": "tcp://127.0.0.1:5002"}
    cfg = extra_config(plan)
    assert cfg["module_path"] == "sglang_patch.storage" and cfg["interface_v1"] == 1
    assert cfg["pool_id"] == "p1" and cfg["namespace"] == "m@abc"
    assert cfg["pool_events_endpoint"] == "tcp://127.0.0.1:5003"
    assert plan.role is Role.MIXED and plan.port == 31000


def test_a_users_cache_report_flag_is_kept_once():
    argv = build_plan([*BASE, "--enable-cache-report"], ports=(1, 2, 3)).sglang_argv
    assert argv.count("--enable-cache-report") == 1


def test_standalone_without_radix_global_has_pool_but_no_events():
    plan = build_plan(BASE, ports=(1, 2, 3))
    assert given(plan.sglang_argv, "kv_events_config") is None
    assert "pool_events_endpoint" not in extra_config(plan)


def test_user_extra_config_is_merged_ours_win():
    user = json.dumps({"prefetch_threshold": 8, "module_path": "evil"})
    plan = build_plan([*BASE, "--hicache-storage-backend-extra-config", user], ports=(1, 2, 3))
    cfg = extra_config(plan)
    assert cfg["prefetch_threshold"] == 8 and cfg["module_path"] == "sglang_patch.storage"
    # the user's stays as written; ours (merged) comes last, and SGLang reads the last one
    assert plan.sglang_argv.count("--hicache-storage-backend-extra-config") == 2
    assert plan.sglang_argv[-2] == "--hicache-storage-backend-extra-config"


def test_role_from_disaggregation_mode_and_contradiction():
    plan = build_plan([*BASE, "--disaggregation-mode", "prefill", "--radix-global-role", "prefill"],
                      ports=(1, 2, 3))
    assert plan.role is Role.PREFILL
    with pytest.raises(LaunchError, match="contradicts"):
        build_plan([*BASE, "--disaggregation-mode", "decode", "--radix-global-role", "prefill"])
    with pytest.raises(LaunchError, match="contradicts"):
        build_plan([*BASE, "--disaggregation-mode", "prefill", "--radix-global-role", "mixed"])


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_pool_handoff_role_without_disaggregation_mode(role):
    """--role prefill|decode alone: registered in that role, SGLang stays a normal server."""
    plan = build_plan([*BASE, "--radix-global-role", role.value], ports=(1, 2, 3))
    argv = plan.sglang_argv
    assert plan.role is role
    assert given(argv, "disaggregation_mode") is None
    assert "--disaggregation-decode-enable-radix-cache" not in argv
    pool_decode = role is Role.DECODE
    assert (given(argv, "hicache_storage_prefetch_policy") == "wait_complete") \
        is pool_decode
    assert (extra_config(plan).get("prefetch_threshold") == 4) is pool_decode  # one page


def test_pool_decode_keeps_the_users_prefetch_choices():
    user = json.dumps({"prefetch_threshold": 64})
    plan = build_plan([*BASE, "--radix-global-role", "decode", "--hicache-storage-prefetch-policy",
                       "timeout", "--hicache-storage-backend-extra-config", user],
                      ports=(1, 2, 3))
    assert given(plan.sglang_argv, "hicache_storage_prefetch_policy") == "timeout"
    assert plan.sglang_argv.count("--hicache-storage-prefetch-policy") == 1
    assert extra_config(plan)["prefetch_threshold"] == 64


def test_native_decode_gets_radix_cache_and_no_pool_defaults():
    plan = build_plan([*BASE, "--disaggregation-mode", "decode"], ports=(1, 2, 3))
    assert plan.role is Role.DECODE
    assert "--disaggregation-decode-enable-radix-cache" in plan.sglang_argv
    assert given(plan.sglang_argv, "hicache_storage_prefetch_policy") is None
    assert "prefetch_threshold" not in extra_config(plan)


@pytest.mark.parametrize("flags, message", [
    (["--hicache-storage-backend", "file"], "provides the L3"),
    (["--kv-events-config", "{}"], "configures the KV-event"),
    (["--hicache-write-policy", "write_back"], "write_through"),
    (["--disable-radix-cache"], "radix cache"),
    (["--hicache-io-backend", "kernel"], "no CPU implementation"),
    (["--hicache-mem-layout", "page_first"], "not supported on CPU"),
    (["--hicache-storage-backend-extra-config", "{nope"], "not JSON"),
    (["--radix-global-pool-load-probe-tokens", "-1"],
     "--radix-global-pool-load-probe-tokens must be an integer >= 0"),
])
def test_impossible_combinations_fail_with_a_message(flags, message):
    with pytest.raises(LaunchError, match=message):
        build_plan([*BASE, *flags], ports=(1, 2, 3))


def test_model_path_required():
    with pytest.raises(LaunchError, match="model-path"):
        build_plan(["--device", "cpu"])


def test_cli_reports_contradiction_before_starting_anything(capsys):
    from sglang_patch.launch_server import main

    assert main([*BASE, "--disaggregation-mode", "decode", "--radix-global-role", "prefill"]) == 2
    assert "contradicts --disaggregation-mode decode" in capsys.readouterr().err


def test_wrong_sglang_version_or_missing_package_is_refused(monkeypatch):
    import importlib.metadata

    from sglang_patch import launch_server

    plan = build_plan(BASE, ports=(1, 2, 3))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.4.0")
    with pytest.raises(LaunchError, match=r"SGLang 0.4.0 is installed.*sglang==0.5.23"):
        launch_server.check_environment(plan)

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(LaunchError, match="SGLang is not installed"):
        launch_server.check_environment(plan)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.23")
    monkeypatch.setattr(launch_server, "REQUIRED_MODULES", ("zmq", "no_such_module_xyz"))
    with pytest.raises(LaunchError, match="missing Python packages: no_such_module_xyz"):
        launch_server.check_environment(plan)


def test_cpu_workers_register_their_host_as_compute_domain():
    import os
    import socket

    from sglang_patch.launch_server import cpu_compute_domain, worker_info

    server = {"page_size": 16, "served_model_name": "m"}
    cpu = worker_info(build_plan(BASE, ports=(1, 2, 3)), server, "m@1")
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    assert cpu.compute_domain == f"cpu@{socket.gethostname()}:{cores}"
    # engines pinned to different cores are different domains
    assert cpu_compute_domain({0}) != cpu_compute_domain({1})
    gpu_argv = [a for a in BASE if a not in ("--device", "cpu")]
    gpu = worker_info(build_plan(gpu_argv, ports=(1, 2, 3)), server, "m@1")
    assert gpu.compute_domain is None


def test_registered_fetch_minimum_is_sglangs_prefetch_threshold():
    from sglang_patch.launch_server import worker_info

    server = {"page_size": 16, "served_model_name": "m"}
    assert worker_info(build_plan(BASE, ports=(1, 2, 3)), server, "m@1"
                       ).pool_fetch_min_tokens == 256  # SGLang's default
    # a pool hand-off decode worker prefetches any page; a user's threshold is kept
    decode = build_plan([*BASE, "--radix-global-role", "decode"], ports=(1, 2, 3))
    assert worker_info(decode, server, "m@1").pool_fetch_min_tokens == 16
    extra = '{"prefetch_threshold": 64}'
    user = build_plan([*BASE, "--hicache-storage-backend-extra-config", extra], ports=(1, 2, 3))
    assert worker_info(user, server, "m@1").pool_fetch_min_tokens == 64
    with pytest.raises(RegistrationError, match="pool_fetch_min_tokens"):
        msgspec.structs.replace(worker_info(user, server, "m@1"), pool_fetch_min_tokens=-1)


def test_registered_prefetch_budget_is_half_the_host_tier():
    from sglang_patch.launch_server import prefetch_budget_tokens, worker_info

    hicache = {"enable_hierarchical_cache": True, "hicache_ratio": 2.0, "hicache_size": 0,
               "internal_states": [{"max_total_num_tokens": 4096}]}
    assert prefetch_budget_tokens(hicache, 6144) == 4096  # host 8,192 tokens
    assert prefetch_budget_tokens({**hicache, "hicache_size": 6}, 6000) == 500_000  # 6 GB
    sharded = {**hicache, "hicache_size": 6, "tp_size": 2}  # 6 GB a rank, 3,000 B a token each
    assert prefetch_budget_tokens(sharded, 6000) == 1_000_000
    for unknown in ({**hicache, "enable_hierarchical_cache": False},
                    {**hicache, "hicache_host_memory_mode": "buffer_only"},
                    {**hicache, "internal_states": []}, {**hicache, "hicache_size": 6}):
        assert prefetch_budget_tokens(unknown, None) == 0, unknown
    server = {"page_size": 16, "served_model_name": "m", **hicache}
    assert worker_info(build_plan(BASE, ports=(1, 2, 3)), server, "m@1"
                       ).pool_prefetch_budget_tokens == 4096
    with pytest.raises(RegistrationError, match="pool_prefetch_budget_tokens"):
        msgspec.structs.replace(worker_info(build_plan(BASE, ports=(1, 2, 3)), server, "m@1"),
                                pool_prefetch_budget_tokens=-1)


@pytest.mark.parametrize("rate", [0.0, -5.0, float("nan"), float("inf")])
def test_a_load_rate_must_be_positive_and_finite(rate):
    from sglang_patch.launch_server import worker_info

    info = worker_info(build_plan(BASE, ports=(1, 2, 3)), {"page_size": 16}, "m@1")
    assert info.pool_load_Bps is None  # measured only once the engine runs
    with pytest.raises(RegistrationError, match="pool_load_Bps"):
        msgspec.structs.replace(info, pool_load_Bps=rate)


def test_registered_bootstrap_port_only_for_a_native_prefill_worker():
    from sglang_patch.launch_server import worker_info

    server = {"served_model_name": "m", "page_size": 4, "disaggregation_bootstrap_port": 8998}
    native = build_plan([*BASE, "--disaggregation-mode", "prefill"], ports=(1, 2, 3))
    pool = build_plan([*BASE, "--radix-global-role", "prefill"], ports=(1, 2, 3))
    assert worker_info(native, server, "m@1").bootstrap_port == 8998
    info = worker_info(pool, server, "m@1")
    assert info.role is Role.PREFILL and info.bootstrap_port is None


def test_free_port_is_below_the_ephemeral_range_and_skips_taken_ports(monkeypatch) -> None:
    from sglang_patch import ports as picker

    ports = [picker.free_port() for _ in range(50)]
    low, high = picker.LATER_BIND_PORTS
    assert all(low <= p <= high for p in ports) and len(set(ports)) == 50
    # Every port of a small range but one is held by someone else: that one comes back.
    base = ports[0] // 100 * 100 if ports[0] + 80 < high else low
    held = []
    try:
        for port in range(base, base + 65):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        free = held.pop(30)
        want = free.getsockname()[1]
        free.close()
        monkeypatch.setattr(picker, "LATER_BIND_PORTS", (base, base + 64))
        monkeypatch.setattr(picker, "_handed", collections.deque(maxlen=512))
        assert picker.free_port() == want
    finally:
        for s in held:
            s.close()


def test_advertised_host_is_bound_and_registered():
    from sglang_patch.launch_server import server_env, worker_info

    argv = [*BASE, "--host", "0.0.0.0", "--radix-global-advertise-host", "10.77.0.2",
            "--radix-global", "http://10.77.0.4:9000"]
    plan = build_plan(argv, ports=(5001, 5002, 5003))
    events = json.loads(given(plan.sglang_argv, "kv_events_config"))
    assert events["endpoint"] == "tcp://10.77.0.2:5001"
    assert events["replay_endpoint"] == "tcp://10.77.0.2:5002"
    assert extra_config(plan)["pool_events_endpoint"] == "tcp://10.77.0.2:5003"
    assert given(plan.sglang_argv, "host") == "0.0.0.0"  # SGLang still listens on all
    info = worker_info(plan, {"page_size": 4, "served_model_name": "m"}, "m@1")
    assert info.url == "http://10.77.0.2:31000" and info.worker_id == "sgl-10.77.0.2-31000"
    assert server_env(plan)["SGLANG_HOST_IP"] == "10.77.0.2"
    # a loopback worker keeps SGLang's own guess of its PD address
    assert "SGLANG_HOST_IP" not in server_env(build_plan(BASE, ports=(1, 2, 3)))


def test_specific_host_is_advertised_by_default():
    plan = build_plan([*BASE, "--host", "10.77.0.3", "--radix-global", "http://r:1"],
                      ports=(5001, 5002, 5003))
    assert plan.url == "http://10.77.0.3:31000"
    assert plan.kv_events_endpoint == "tcp://10.77.0.3:5001"


@pytest.mark.parametrize("argv, match", [
    (["--host", "0.0.0.0"], "add --radix-global-advertise-host"),
    (["--host", "::"], "add --radix-global-advertise-host"),
    (["--host", "127.0.0.1", "--radix-global-advertise-host", "10.77.0.2"], "would not listen"),
    (["--host", "0.0.0.0", "--radix-global-advertise-host", "0.0.0.0"], "not an address"),
    (["--radix-global-advertise-host", "10.77.0.2"], "would not listen"),  # --host: 127.0.0.1
    (["--host", "::", "--radix-global-advertise-host", "fd00::2"], "IPv6 is not supported"),
    (["--host", "::1"], "IPv6 is not supported"),
])
def test_unreachable_advertisements_are_refused(argv, match):
    with pytest.raises(LaunchError, match=match):
        build_plan([*BASE, *argv, "--radix-global", "http://r:1"], ports=(1, 2, 3))


def test_an_advertised_address_not_of_this_host_is_refused_when_ports_are_chosen():
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine, so nothing can bind it
    with pytest.raises(LaunchError, match=r"cannot bind the event endpoints on 192\.0\.2\.7"):
        build_plan([*BASE, "--host", "0.0.0.0", "--radix-global-advertise-host", "192.0.2.7",
                    "--radix-global", "http://r:1"])


def test_fixed_event_ports_leave_room_for_every_dp_rank():
    plan = build_plan([*BASE, "--host", "10.77.0.2", "--radix-global", "http://r:1",
                       "--radix-global-event-port-base", "5500", "--dp-size", "2"])
    assert plan.kv_events_endpoint == "tcp://10.77.0.2:5500"  # ranks 0, 1: 5500, 5501
    assert plan.kv_events_replay_endpoint == "tcp://10.77.0.2:5502"  # 5502, 5503
    assert plan.pool_events_endpoint == "tcp://10.77.0.2:5504"
    with pytest.raises(LaunchError, match=r"within 1\.\.65535"):
        build_plan([*BASE, "--radix-global", "http://r:1",
                    "--radix-global-event-port-base", "65534"])
    attn = build_plan([*BASE, "--radix-global", "http://r:1",
                       "--radix-global-event-port-base", "5500", "--attn-dp-size", "4"])
    assert attn.pool_events_endpoint == "tcp://127.0.0.1:5508"
    with pytest.raises(LaunchError, match="include the server's --port 31000"):
        build_plan([*BASE, "--radix-global", "http://r:1",
                    "--radix-global-event-port-base", "30999"])


def test_a_mooncake_pool_is_shared_by_every_host_of_its_master():
    plan = build_plan([*BASE, "--host", "10.77.0.2", "--radix-global", "http://r:1",
                       "--radix-global-pool", "mooncake://10.77.0.5:50051"], ports=(1, 2, 3))
    cfg = extra_config(plan)
    assert cfg["pool"] == "mooncake" and cfg["mooncake_master"] == "10.77.0.5:50051"
    assert cfg["mooncake_local_hostname"] == "10.77.0.2"  # its segment, reachable from afar
    # this worker's segment of the store (radix_global/pool_ids.py): one per worker
    assert cfg["pool_id"] == plan.flags.pool_id == "mooncake-10.77.0.5-50051@10.77.0.2:31000"
    assert extra_config(build_plan(BASE, ports=(1, 2, 3))).get("pool") is None  # shm default
    for bad in ("mooncake://nohost", "redis://h:1", "mooncake://:5"):
        with pytest.raises(LaunchError, match="shm or mooncake://"):
            build_plan([*BASE, "--radix-global-pool", bad], ports=(1, 2, 3))
    with pytest.raises(LaunchError, match="--radix-global-pool mooncake://"):
        build_plan([*BASE, "--hicache-storage-backend", "mooncake"], ports=(1, 2, 3))
    mooncake = [*BASE, "--radix-global-pool", "mooncake://m:1"]
    for extra, match in ((["--radix-global-pool-capacity-gb", "0.01"], "at least 16 MiB"),
                         (["--radix-global-pool-root", "/dev/shm/x"], "no root")):
        with pytest.raises(LaunchError, match=match):
            build_plan([*mooncake, *extra], ports=(1, 2, 3))
    with pytest.raises(LaunchError, match="an shm pool id may not contain it"):
        build_plan([*BASE, "--radix-global-pool-id", "a@b"], ports=(1, 2, 3))


def test_a_disk_tier_goes_under_a_mooncake_segment_too(tmp_path):
    """Persistence and sharing together (docs/interfaces.md, "The persistent disk tier under
    the pool"): the disk is this worker's, its holder the segment's ``+disk``."""
    from sglang_patch.launch_server import worker_info

    disk = tmp_path / "disk"
    plan = build_plan([*BASE, "--host", "10.77.0.2", "--radix-global", "http://r:1",
                       "--radix-global-pool", "mooncake://10.77.0.5:50051",
                       "--radix-global-pool-disk", str(disk)], ports=(1, 2, 3))
    assert extra_config(plan)["pool_disk"] == str(disk)
    assert plan.backend_config["pool_copies_url"] == "http://r:1"  # a segment takes copies
    # the stall bound is in the engine's environment from its start (an operator's wins)
    from sglang_patch.launch_server import server_env
    from sglang_patch.pool.mooncake_stall import STALL_ENV

    env = server_env(plan)
    assert [env[name] for name in STALL_ENV] == ["10", "10"]
    plan.backend_config["pool_read_stall_s"] = "soon"
    with pytest.raises(LaunchError, match=r"pool_read_stall_s must be a number.*'soon'"):
        server_env(plan)
    info = worker_info(plan, {"page_size": 16, "served_model_name": "m"}, "m@1")
    assert info.pool_disk_id == "mooncake-10.77.0.5-50051@10.77.0.2:31000+disk"


def test_a_place_is_registered_and_a_bad_one_refused_before_the_engine_starts():
    """docs/interfaces.md, "Where hosts are"."""
    from sglang_patch.launch_server import worker_info

    plan = build_plan([*BASE, "--radix-global", "http://r:1",
                       "--radix-global-place", "zone-a/rack-3"], ports=(1, 2, 3))
    info = worker_info(plan, {"page_size": 16, "served_model_name": "m"}, "m@1")
    assert info.place == "zone-a/rack-3"
    assert plan.backend_config["pool_loads_url"] == "http://r:1"  # it times its loads for it
    assert "pool_copies_url" not in plan.backend_config  # an shm pool takes no copy orders
    with pytest.raises(LaunchError, match="radix-global-place must be 1 to 4"):
        build_plan([*BASE, "--radix-global", "http://r:1", "--radix-global-place", "rack 3"],
                   ports=(1, 2, 3))


def test_registered_pool_capacity_is_the_pool_flags():
    from sglang_patch.launch_server import worker_info

    server = {"page_size": 16, "served_model_name": "m"}
    plan = build_plan([*BASE, "--radix-global-pool-capacity-gb", "0.5"], ports=(1, 2, 3))
    info = worker_info(plan, server, "m@1")
    assert info.pool_capacity_bytes == 1 << 29
    with pytest.raises(RegistrationError, match="pool_capacity_bytes"):
        msgspec.structs.replace(info, pool_capacity_bytes=0)
