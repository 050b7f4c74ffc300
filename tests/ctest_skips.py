#!/usr/bin/env python3
"""Skip report of one ctest run, from its JUnit file (ctest --output-junit):
how many tests ctest counted as Skipped, and why, then the test cases that were
skipped inside tests that otherwise ran, then what the fleet tests that passed
say they ran (their `launch.<name>: ...` lines: steps, hosts, seconds). run_tests.sh prints it after each
ctest stage, below ctest's own summary line (which it leaves alone).

The reason is what the test printed: `SKIP: <test>: <reason>` lines (the Python
scripts, through tests/unittest_main.py or worker/python/tests/conftest.py),
or the message after a gtest `...: Skipped` line (GTEST_SKIP() << "reason").

  ctest_skips.py STAGE JUNIT_XML      # always exits 0: a report, not a test
"""
import re
import sys
import xml.etree.ElementTree as ET

GTEST_SKIP = re.compile(r": Skipped\n(.*)")
RAN = re.compile(r"^launch\.\w+: .*")  # tests/unittest_main.py note() lines
SHOW_NAMES = 4  # names listed per reason before "+N more"


def skip_lines(out):
    return [l[len("SKIP: "):].strip() for l in out.splitlines()
            if l.startswith("SKIP: ") and not l.startswith("SKIP: nothing ran")]


def reason(case, out):
    lines = skip_lines(out)
    if lines:
        return "; ".join(dict.fromkeys(lines))
    m = GTEST_SKIP.search(out)
    if m:
        return m.group(1).strip() or "GTEST_SKIP() without a message"
    el = case.find("skipped")
    why = el.get("message") if el is not None else case.get("status")
    return "%s, no reason printed" % why


def main(stage, path):
    try:
        cases = ET.parse(path).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        print("run_tests: %s: no skip report (%s)" % (stage, e))
        return 0
    total, skipped, inner, ran = 0, {}, [], []
    for case in cases:
        total += 1
        out = case.findtext("system-out") or ""
        name = case.get("name")
        if case.get("status") in ("notrun", "disabled"):
            skipped.setdefault(reason(case, out), []).append(name)
        elif case.get("status") == "run":
            inner += ["%s: %s" % (name, l) for l in skip_lines(out)]
            ran += [l.strip() for l in out.splitlines() if RAN.match(l)]
    n = sum(len(v) for v in skipped.values())
    print("run_tests: %s: %d of %d tests skipped%s" % (stage, n, total, ":" if n else ""))
    for why, names in sorted(skipped.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(names[:SHOW_NAMES])
        if len(names) > SHOW_NAMES:
            shown += ", +%d more" % (len(names) - SHOW_NAMES)
        print("  %s: %s" % (shown, why))
    if inner:
        print("run_tests: %s: %d test case%s skipped inside tests that ran:"
              % (stage, len(inner), "" if len(inner) == 1 else "s"))
        for line in inner:
            print("  " + line)
    if ran:
        print("run_tests: %s: what the fleet tests ran:" % stage)
        for line in ran:
            print("  " + line)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
