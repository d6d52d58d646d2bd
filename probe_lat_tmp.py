import asyncio, time, tempfile, uuid, json, sys, statistics
from pathlib import Path
from pawn_queue import PawnQueue
from tests.servers.seaweedfs import SeaweedFS
from bench.common import s3_settings

SCRIPT = """
import asyncio, json, sys, time
from pawn_queue import PawnQueue
from pawn_queue._protocol import signal_writer
_sig = signal_writer.SignalWriter.signal
async def sig(self, topics, at_once=False):
    t0 = time.time()
    await _sig(self, topics, at_once=at_once)
    print(json.dumps({"sig": [t0, time.time()]}), flush=True)
signal_writer.SignalWriter.signal = sig
async def main():
    async with await PawnQueue.from_config(json.loads(sys.argv[1])) as pq:
        p = await pq.register_producer("p")
        start = time.monotonic()
        for i in range(int(sys.argv[2])):
            await asyncio.sleep(max(0, start + i / float(sys.argv[3]) - time.monotonic()))
            t = time.time()
            await p.publish("t", {"t": t, "i": i})
            print(json.dumps({"i": i, "pub": time.time() - t}), flush=True)
        await asyncio.sleep(1)
asyncio.run(main())
"""

from pawn_queue._protocol import notify, claiming
EV = {}
_hint = notify.ChangeSignals._hint
def hint(self, topic, names):
    for n in names: EV.setdefault(n.split("-",1)[1].split(".")[0], {})["hint"] = time.time()
    return _hint(self, topic, names)
notify.ChangeSignals._hint = hint
_look = notify.ChangeSignals._look
async def look(self, since=None):
    r = await _look(self, since)
    if r: EV.setdefault("looks", []).append(time.time())
    return r
notify.ChangeSignals._look = look
_ch = claiming.Claimer._claim_hinted
async def ch(self, topic, keys, wanted):
    for k in keys: EV.setdefault(k.rsplit("/",1)[1].split("-",1)[1].split(".")[0], {})["claim"] = time.time()
    return await _ch(self, topic, keys, wanted)
claiming.Claimer._claim_hinted = ch

async def main(server, rate, n):
    bucket = f"probe-{uuid.uuid4().hex[:8]}"
    server.create_bucket(bucket)
    cfg = {"backend": "s3", "s3": {**s3_settings(server.endpoint), "bucket_name": bucket}}
    async with await PawnQueue.from_config(cfg) as here:
        await here.create_topic("t")
        c = await here.register_consumer("c", topics=["t"])
        lat = []
        async def h(m):
            now = time.time()
            lat.append(now - m.payload["t"])
            key = m._claimed.key if hasattr(m, "_claimed") else None
            EV.setdefault("msg", []).append((m.payload["t"], now))
            await m.ack()
        task = asyncio.create_task(c.listen(h))
        await asyncio.sleep(2)
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", SCRIPT, json.dumps(cfg), str(n), str(rate), stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        lines = [json.loads(l) for l in out.decode().splitlines()]
        pubs = [l["pub"] for l in lines if "pub" in l]
        sigs = [l["sig"] for l in lines if "sig" in l]
        import bisect
        ends = sorted(b for a, b in sigs)
        looks = EV.get("looks", [])
        gaps = []
        for lk in looks:
            i = bisect.bisect_right(ends, lk) - 1
            if i >= 0: gaps.append((lk - ends[i]) * 1000)
        if gaps: print("sig end -> look seen p50", statistics.median(gaps), "looks", len(looks))
        starts = sorted(a for a, b in sigs)
        print("signal spacing p50 ms", statistics.median([(b - a)*1000 for a, b in zip(starts, starts[1:])]) if len(starts) > 1 else None)
        print("signal calls", len(sigs), "duration p50 ms", statistics.median([(b-a)*1000 for a,b in sigs]))
        await asyncio.sleep(1)
        lat.sort()
        print(f"rate {rate}: n={len(lat)} p50={statistics.median(lat)*1000:.0f} ms p90={lat[int(len(lat)*0.9)]*1000:.0f} pub p50={statistics.median(pubs)*1000:.1f} ms")
        task.cancel()
        hints = [(v["hint"], v.get("claim")) for k, v in EV.items() if k not in ("msg", "looks") and "hint" in v]
        hints.sort()
        msgs = sorted(EV.get("msg", []))
        # pair by order
        d1 = [ (h - m[0])*1000 for (h, c), m in zip(hints, msgs)]
        d2 = [ ((c or h) - h)*1000 for (h, c) in hints]
        d3 = [ (m[1] - (c or h))*1000 for (h, c), m in zip(hints, msgs)]
        print("pub->hint p50", statistics.median(d1), "hint->claim p50", statistics.median(d2), "claim->handler p50", statistics.median(d3), "claims", sum(1 for h,c in hints if c))
        EV.clear()

with tempfile.TemporaryDirectory() as tmp:
    server = SeaweedFS.start(Path(tmp) / "sw")
    try:
        for rate in (1, 10):
            asyncio.run(main(server, rate, 10 if rate == 1 else 100))
    finally:
        server.stop()
