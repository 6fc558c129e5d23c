"""The leader lease: which router of a cluster runs the once-per-cluster jobs (profiling a
joining worker, hot-prefix and join warming).

One key holds ``<router id> <nonce>``: the nonce is this process's, so a second process started
with the same router id never renews (nor deletes) the first one's lease. Acquired with
``SET NX PX``, renewed and released only while the key still holds this holder's value (Lua
compare-and-expire, compare-and-delete). Held, as this router counts it, for 90 % of the lease
from before the call that got it, so it stops leading before the key can expire and another
router take it.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import redis.asyncio as aioredis

log = logging.getLogger("radix_global.router.coordination")
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
          "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end")
_RELEASE = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
            "return redis.call('del', KEYS[1]) else return 0 end")


class Lease:
    def __init__(self, redis: aioredis.Redis, key: str, router_id: str, lease_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis, self.key, self.router_id = redis, key, router_id
        self.value = f"{router_id} {secrets.token_hex(8)}"
        self.lease_ms = max(1, int(lease_s * 1000))
        self.clock = clock
        self._until = 0.0

    def held(self) -> bool:
        return self.clock() < self._until

    async def renew(self) -> None:
        """Renew the lease, or take it when free; raises the service's error (the caller
        counts it: a lease not renewed lapses on its own)."""
        start = self.clock()
        ok = bool(await self.redis.eval(_RENEW, 1, self.key, self.value, self.lease_ms))
        if not ok:
            ok = bool(await self.redis.set(self.key, self.value, nx=True, px=self.lease_ms))
            if ok:
                log.info("coordination: router %s leads", self.router_id)
        self._until = start + self.lease_ms / 1000 * 0.9 if ok else 0.0

    async def release(self) -> None:
        if self.held():
            self._until = 0.0
            await self.redis.eval(_RELEASE, 1, self.key, self.value)
