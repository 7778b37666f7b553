"""``simsparse testbed up|down|status [SPEC]``: the emulated cluster by hand.

``up SPEC -P N`` builds the machine SPEC describes for N ranks and leaves it
up (``measure --testbed SPEC`` and ``calibrate --testbed SPEC`` then use it
instead of building their own); ``down SPEC`` removes it; ``status`` lists
the testbeds of this host with their namespaces and what crossed their
queues. Every error is one sentence (exit status 2).
"""
from __future__ import annotations

from . import host, load_spec, plan


def up(spec_name: str, P: int) -> int:
    spec = load_spec(spec_name)
    pl = plan(spec, P)
    host.up(pl, persistent=True)
    print(f"testbed {pl.name} is up: {P} hosts in namespaces {pl.rank_netns(0)} .. {pl.rank_netns(P - 1)}, "
          f"{len(pl.bridges)} switch(es), {len(pl.queues)} shaped queues "
          f"(mtu {pl.mtu}, host links at {_rate(spec.link_bw_Bps if spec.framing == 'tcp' else pl.queues[0].rate_Bps)})")
    print(f"take it down with: simsparse testbed down {spec_name}")
    return 0


def down(spec_name: str) -> int:
    name = _name(spec_name)
    if host.down(name):
        print(f"testbed {name} is down")
    else:
        print(f"no testbed named {name} was up")
    return 0


def status(spec_name: str | None = None) -> int:
    stale = host.cleanup_stale()
    for s in stale:
        print(f"removed testbed {s}, left behind by a run that was killed")
    wanted = _name(spec_name) if spec_name else None
    shown = 0
    present = set(host.existing_namespaces())
    for st in host.states():
        if wanted and st["name"] != wanted:
            continue
        shown += 1
        missing = [ns for ns in st["namespaces"] if ns not in present]
        owner = "by `simsparse testbed up`" if st.get("owner") is None else f"by process {st['owner']['pid']}"
        print(f"{st['name']}: P = {st['P']}, {len(st['namespaces'])} namespaces"
              f"{f' ({len(missing)} missing)' if missing else ''}, made {owner}")
        if missing:
            continue
        for c in host.counters(st):
            print(f"  {c['ns']:>8} {c['dev']:>10} {c['role']:>4} {_rate(c['rate_Bps']):>10} "
                  f"{c['bytes']:>14,d} B {c['packets']:>10,d} packets {c['drops']:>6,d} drops")
    if not shown:
        print("no testbed is up" + (f" named {wanted}" if wanted else ""))
    return 0


def _name(spec_name: str) -> str:
    """A testbed's name from its description, or the name itself."""
    from .plan import testbed_name

    try:
        return testbed_name(load_spec(spec_name))
    except Exception:   # not a description: take it as a name
        return spec_name


def _rate(bps: float) -> str:
    return f"{bps * 8 / 1e6:g} Mb/s"
