#!/usr/bin/env python3
"""Run a cancelsim op log through the contract's own Python reference.

The reference ("Run a local ownership reference" in shared/seeds/000_73d9a7374fc66ac2.txt) is
read out of the seed document at run time and executed as written; nothing of it is copied into
this repository. This script only adapts the JSON Lines op-log format of `cancelsim replay` to the
reference's `Owners` API, so that the two can be compared line by line:

    python3 tools/reference_oracle.py SEED.txt OPLOG.jsonl        > oracle.jsonl
    python3 tools/reference_oracle.py SEED.txt --check OPLOG.jsonl EXPECTED.jsonl
    python3 tools/reference_oracle.py SEED.txt --fuzz N SEED_INT [BINARY]   # random logs vs cancelsim

Error lines are compared as "an error", not by message: the reference raises Python exceptions.

Two-phase admission: `admit_begin` runs the reference's `admit` up to its wait (validation and the
epoch capture) and stops there; `admit_end` runs `admit` afresh with the captured epoch standing in
for the barrier epoch until the wait returns, so the reference checks the post-wait state exactly
as its own coroutine would, and a failed end can be retried.
"""
import json
import random
import subprocess
import sys


def load_reference(seed_path):
    text = open(seed_path, encoding="utf-8").read()
    start = text.index("import asyncio\nfrom dataclasses import dataclass")
    end = text.index("asyncio.run(tests())", start)
    code = text[start:end]
    namespace = {}
    exec(compile(code, seed_path, "exec"), namespace)
    return namespace["Owners"]


class Stop(Exception):
    pass


class Driver:
    def __init__(self, Owners):
        self.owners = Owners()
        self.tickets = {}
        self.used = set()

    def op(self, obj):
        o = self.owners
        op = obj.get("op")
        if not isinstance(op, str):
            raise ValueError("op")
        allowed = {
            "start": {"request", "generation"},
            "finish": {"request", "disposition"},
            "update": {"request", "revision", "payload", "final"},
            "admit_begin": {"ticket", "request", "generation", "born", "max_age"},
            "admit_end": {"ticket", "now"},
            "admit": {"request", "generation", "born", "max_age", "now"},
            "barrier_advance": set(),
            "set_clear": {"clear"},
        }
        if op not in allowed:
            raise ValueError("unknown op")
        if set(obj) - {"op"} - allowed[op]:
            raise ValueError("unknown field")
        # Presence and JSON types first, as the op-log format requires.
        def need(name, kind):
            if name not in obj:
                raise ValueError("missing " + name)
            v = obj[name]
            ok = {
                "str": type(v) is str,
                "int": type(v) is int,
                "num": type(v) in (int, float),
                "bool": type(v) is bool,
            }[kind]
            if not ok:
                raise ValueError("type " + name)
            return v

        if op == "start":
            r, g = need("request", "str"), need("generation", "int")
            o.start(r, g)
            return {"result": "started"}
        if op == "finish":
            r, d = need("request", "str"), need("disposition", "str")
            return {"result": o.finish(r, d)}
        if op == "update":
            r, rev, p = need("request", "str"), need("revision", "int"), need("payload", "str")
            fin = need("final", "bool") if "final" in obj else False
            return {"result": o.update(r, rev, p.encode("utf-8"), fin)}
        if op == "admit_begin":
            t, r, g = need("ticket", "str"), need("request", "str"), need("generation", "int")
            born, max_age = need("born", "num"), need("max_age", "num")
            if t in self.tickets or t in self.used:
                raise ValueError("ticket used")
            epoch = o.barrier_epoch

            async def stop():
                raise Stop()

            try:
                _drive(o.admit(r, g, born, lambda: 0, max_age, stop))
            except Stop:
                pass
            self.tickets[t] = (r, g, born, max_age, epoch)
            return {"result": "waiting"}
        if op == "admit_end":
            t, now = need("ticket", "str"), need("now", "num")
            if t not in self.tickets:
                raise ValueError("unknown ticket")
            r, g, born, max_age, epoch = self.tickets[t]
            real = o.barrier_epoch

            async def restore():
                o.barrier_epoch = real

            o.barrier_epoch = epoch
            try:
                res = _drive(o.admit(r, g, born, lambda: now, max_age, restore))
            finally:
                o.barrier_epoch = real
            del self.tickets[t]
            self.used.add(t)
            return self.admission(res, r)
        if op == "admit":
            r, g = need("request", "str"), need("generation", "int")
            born, max_age, now = need("born", "num"), need("max_age", "num"), need("now", "num")

            async def noop():
                pass

            return self.admission(_drive(o.admit(r, g, born, lambda: now, max_age, noop)), r)
        if op == "barrier_advance":
            o.barrier_epoch += 1
            return {"result": "ok"}
        if op == "set_clear":
            o.clear = need("clear", "bool")
            return {"result": "ok"}
        raise AssertionError(op)

    def admission(self, res, r):
        if res == "submitted":
            return {"result": "submitted", "payload": self.owners.rows[r].payload.decode("utf-8")}
        return {"result": res}

    def line(self, text):
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
            return self.op(obj)
        except (ValueError, KeyError, TypeError) as e:
            return {"error": type(e).__name__}


def _drive(coro):
    try:
        coro.send(None)
    except StopIteration as s:
        return s.value
    raise AssertionError("the reference awaited something other than its wait")


def oracle_lines(Owners, lines):
    d = Driver(Owners)
    return [d.line(l) for l in lines]


def random_log(rng, n):
    ids = ["a", "b", "c", "", "d"]
    def val(kind):
        if rng.random() < 0.06:
            return rng.choice([True, 2.0, "x", None, [1], -1])
        return {
            "id": lambda: rng.choice(ids),
            "gen": lambda: rng.choice([0, 1, 2, -1]),
            "rev": lambda: rng.choice([0, 1, 2, 3, -1]),
            "payload": lambda: rng.choice(["p", "q", "é"]),
            "num": lambda: rng.choice([0, 1, 2, 2.5, 5, -1, 1e300]),
            "ticket": lambda: rng.choice(["t1", "t2", "t3"]),
        }[kind]()
    ops = []
    for _ in range(n):
        k = rng.choice(["start", "start", "finish", "update", "update", "update", "admit", "admit_begin", "admit_end", "barrier_advance", "set_clear", "bogus"])
        if k == "start":
            o = {"op": k, "request": val("id"), "generation": val("gen")}
        elif k == "finish":
            o = {"op": k, "request": val("id"), "disposition": rng.choice(["completed", "cancelled", "expired", "running"])}
        elif k == "update":
            o = {"op": k, "request": val("id"), "revision": val("rev"), "payload": val("payload")}
            if rng.random() < 0.5:
                o["final"] = rng.choice([True, False])
        elif k == "admit":
            o = {"op": k, "request": val("id"), "generation": val("gen"), "born": val("num"), "max_age": val("num"), "now": val("num")}
        elif k == "admit_begin":
            o = {"op": k, "ticket": val("ticket"), "request": val("id"), "generation": val("gen"), "born": val("num"), "max_age": val("num")}
        elif k == "admit_end":
            o = {"op": k, "ticket": val("ticket"), "now": val("num")}
        elif k == "set_clear":
            o = {"op": k, "clear": rng.random() < 0.7}
        else:
            o = {"op": k}
        if rng.random() < 0.03:
            o.pop(rng.choice(list(o)))
        ops.append(json.dumps(o, ensure_ascii=False))
    if rng.random() < 0.2:
        ops.insert(rng.randrange(len(ops) + 1), "{not json")
    return ops


def normalise(obj):
    """Compare words, not error texts: both sides must agree on error vs result and the result."""
    return {"error": True} if "error" in obj else obj


def main():
    seed_doc = sys.argv[1]
    Owners = load_reference(seed_doc)
    if sys.argv[2] == "--fuzz":
        n, seed = int(sys.argv[3]), int(sys.argv[4])
        binary = sys.argv[5] if len(sys.argv) > 5 else "target/debug/cancelsim"
        rng = random.Random(seed)
        lines_total = 0
        for case in range(n):
            log = random_log(rng, rng.randrange(1, 40))
            expect = [normalise(x) for x in oracle_lines(Owners, log)]
            out = subprocess.run([binary, "replay", "-"], input="\n".join(log) + "\n", capture_output=True, text=True, check=True)
            got = [normalise(json.loads(l)) for l in out.stdout.splitlines()]
            if got != expect:
                for i, (g, e) in enumerate(zip(got, expect)):
                    if g != e:
                        print("MISMATCH case", case, "line", i + 1, log[i], "cancelsim", g, "reference", e)
                        break
                print("\n".join(log))
                sys.exit(1)
            lines_total += len(log)
        print(f"{n} random op logs, {lines_total} lines: cancelsim replay agrees with the reference")
        return
    if sys.argv[2] == "--check":
        lines = open(sys.argv[3], encoding="utf-8").read().splitlines()
        expect = [normalise(x) for x in oracle_lines(Owners, lines)]
        got = [normalise(json.loads(l)) for l in open(sys.argv[4], encoding="utf-8")]
        if got != expect:
            print(f"{sys.argv[4]} disagrees with the reference")
            for i, (g, e) in enumerate(zip(got, expect)):
                if g != e:
                    print(f"line {i + 1}: {lines[i]} expected {e}, file says {g}")
            sys.exit(1)
        print(f"{sys.argv[4]}: {len(got)} lines agree with the reference")
        return
    lines = open(sys.argv[2], encoding="utf-8").read().splitlines()
    for obj in oracle_lines(Owners, lines):
        print(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


if __name__ == "__main__":
    main()
