"""Summarise a py-spy collapsed-stack profile (``drain_throughput.py --profile FILE``).

Prints, for the drainer's busy samples, the share of samples per thread
group (the main thread that claims and records, the send pool), and the
functions with the most inclusive and self samples, so "what dominated" can
be read without a flame graph viewer::

    python bench/profile_summary.py /tmp/drain.txt --top 25
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

_THREAD = re.compile(r"^thread \((\d+)\): ([^;]*)")
_LINE_NUMBER = re.compile(r":\d+\)$")


def _frame_name(frame: str) -> str:
    """``Cursor.execute (psycopg/cursor.py:113)`` -> ``Cursor.execute (psycopg/cursor.py)``."""
    return _LINE_NUMBER.sub(")", frame.strip())


def summarise(lines: list[str], top: int, match: str | None = None) -> str:
    groups: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    self_samples: collections.Counter[str] = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = _THREAD.match(frames[0])
        group = "send pool" if "outboxkit-send" in stack or "_worker (concurrent" in stack else "main thread"
        if thread and thread.group(2) and thread.group(2) != "MainThread" and group != "send pool":
            group = thread.group(2)
        names = [_frame_name(frame) for frame in frames[1:]]
        if match and not any(match in name for name in names):
            continue
        total += count
        groups[group] += count
        for name in set(names):
            inclusive[name] += count
        if names:
            self_samples[names[-1]] += count
    if not total:
        return "no samples"
    out = [f"{total} samples"]
    out += [f"  {share:6.1%}  {group}" for group, share in ((g, c / total) for g, c in groups.most_common())]
    out.append(f"top {top} inclusive:")
    out += [f"  {count / total:6.1%}  {name}" for name, count in inclusive.most_common(top)]
    out.append(f"top {top} self:")
    out += [f"  {count / total:6.1%}  {name}" for name, count in self_samples.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="collapsed stacks written by py-spy --format raw")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", help="only stacks with a frame containing this text")
    arguments = parser.parse_args(argv)
    with open(arguments.profile, encoding="utf-8") as handle:
        print(summarise(handle.readlines(), arguments.top, arguments.match))
    return 0


if __name__ == "__main__":
    sys.exit(main())
