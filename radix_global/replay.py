"""The replay protocol of a KV-event publisher (SGLang's and vLLM's ZMQ ROUTER): ask for the
batches from a start seq on.

DEALER to the engine's ROUTER: send ``start`` as 8 bytes big-endian, receive ``(topic, seq,
payload)`` (SGLang) or ``(seq, payload)`` (vLLM) frames until seq ``END_SEQ`` (-1).
"""

from __future__ import annotations

import asyncio
import logging

import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

END_SEQ = -1


async def request_replay(ctx: zmq.asyncio.Context, endpoint: str, start: int, timeout_s: float
                         ) -> list[tuple[int, bytes]] | None:
    """The publisher's batches from ``start`` on; None when the replay failed (never raises:
    a failed replay is a gap that resyncs, not a message left unhandled)."""
    try:
        sock = ctx.socket(zmq.DEALER)
    except zmq.ZMQError as exc:
        log.warning("replay from %r: no socket: %s", endpoint[:200], exc)
        return None
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        log.warning("replay from %r: cannot connect: %s", endpoint[:200], exc)
        return None
    out: list[tuple[int, bytes]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        await sock.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            frames = await asyncio.wait_for(sock.recv_multipart(), left)
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) not in (2, 3) or len(frames[-2]) != 8:
                return None
            s = int.from_bytes(frames[-2], "big", signed=True)
            if s == END_SEQ:
                return out
            if s < 0:
                log.warning("replay from %s sent seq %d: refused", endpoint, s)
                return None
            out.append((s, frames[-1]))
    except (TimeoutError, zmq.ZMQError) as exc:
        log.warning("replay from %s (start %d) failed: %r", endpoint, start, exc)
        return None
    finally:
        sock.close(linger=0)
