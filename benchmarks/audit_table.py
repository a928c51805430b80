"""Claimed vs empirical epsilon for every step method and for deliberately broken variants.

Run: ``python benchmarks/audit_table.py [--scale 2] [--out docs/audit.md]``

Each row runs one iteration of the mechanism from a fixed state many times on two
neighbouring datasets (record 0 at +100 vs -100) and reports the Clopper-Pearson lower
bound on epsilon (95 % confidence, Bonferroni over all events) next to the accountant's
per-iteration claim at the same delta. See ``pymc_dp.audit``.
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings
from pathlib import Path

import pymc

from pymc_dp.audit import audit_mechanism, standard_scenarios

HEADER = """# Privacy audit

Empirical lower bounds on the per-iteration epsilon of each step method, next to what the
accountant claims, from `python benchmarks/audit_table.py{args}` ({env}).

One iteration of the step's mechanism runs from a fixed state on two neighbouring datasets
that differ in one record chosen adversarially (record 0 is +100 in D and -100 in D', so
its clipped contribution sits at +bound in D and at -bound in D'). Every output the step
publishes gives events (the accept bit; thresholds on the noisy acceptance probability, on
the next position and on the step length); Clopper-Pearson bounds on their probabilities
give `eps_lb = ln((p_D - delta) / p_D')`, valid with 95 % confidence jointly over all events
(Bonferroni), maximised over events and both directions (Jagielski et al. 2020; Nasr et al.
2021). A correct mechanism must stay at or below its claim; a broken one must exceed it, or
the audit could not tell them apart. The same scenarios run in the test suite
(`tests/test_audit.py`).

The `auto:` rows are the automatic mode's pre-sampling mechanisms ([Automatic
configuration](auto.md)): the clip histogram (record 0 is 0.3 in D and 100 in D', so it
moves between two bins; the event is a threshold on the difference of those two noisy
bins), the warm start's gradient and outer-product sums (record 0 at -100 / +100; in one
dimension its outer product is the same in D and D', so the audit sees half the claimed
loss: the noise divided by 3 is caught, halved it is not), the same with the outer products
centred on the first release (the warm start's Newton steps: a new centre in every trial,
the clip bound and noise that follow from it; record 0 now moves both releases), the
penalty test with the control variate, and the one-shot strategy's gradient release, through
the library's own call (`pymc_dp.auto.oneshot.release_gradient_sum`; record 0 at -100 /
+100).

A lower bound below the claim does not prove the claim: the audit only sees the events it
tests, with finite trials. It catches gross errors (missing clipping, noise on the wrong
scale, noise-free branches), which is what it is for.

| step | variant | delta | claimed epsilon | empirical lower bound | trials per dataset | verdict |
| --- | --- | --- | --- | --- | --- | --- |
"""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1.0, help="multiply the trials")
    p.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows = []
    for s in standard_scenarios():
        trials = int(s.trials * args.scale)
        t0 = time.perf_counter()
        res = audit_mechanism(s.make_runner(), s.delta, trials=trials, seed=args.seed)
        ok = res.eps_lb <= s.claimed_epsilon if s.must_hold else res.eps_lb > s.claimed_epsilon
        verdict = ("holds" if ok else "VIOLATED") if s.must_hold else ("caught" if ok else "MISSED")
        row = (
            f"| {s.step} | {s.variant} | {s.delta:g} | {s.claimed_epsilon:.3f} | "
            f"{res.eps_lb:.3f} | {trials:,} | {verdict} |"
        )
        print(row, f"  ({time.perf_counter() - t0:.0f} s; event: {res.event})", flush=True)
        rows.append(row)
    if args.out:
        env = f"Python {platform.python_version()}, PyMC {pymc.__version__}"
        arg_text = f" --scale {args.scale:g}" if args.scale != 1 else ""
        # keep the sections after the table (e.g. the minibatch steps, made by their tests)
        old = args.out.read_text() if args.out.exists() else ""
        rest = old[old.index("\n## ") :] if "\n## " in old else ""
        table = HEADER.format(args=arg_text, env=env) + "\n".join(rows) + "\n"
        args.out.write_text(table + rest)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
