"""The main() of every unittest script registered with ctest: runs the script's
tests and exits with the code ctest should see, so that a script that could not
run is reported Skipped rather than Passed.

  0   at least one test ran, and every test that ran passed
  1   a test failed or errored, or the script holds no test at all
  77  nothing ran: every test, or the class or module set-up, raised SkipTest
      (ctest shows it as Skipped through SKIP_RETURN_CODE 77)

Every skip, whole-script or of one test case, is printed on stdout as
`SKIP: <test>: <reason>`; run_tests.sh collects those lines into its skip
report. Lines given to note() (what a test ran: steps, hosts, seconds) are
printed last, after unittest's own report."""
import sys
import unittest

SKIP = 77  # ctest SKIP_RETURN_CODE
_notes = []


def note(line):
    """Prints `line` after the test report (so it is not torn into unittest's
    `test ... ok` lines): what the test really ran."""
    _notes.append(line)


def _name(test):
    # A class or module set-up that raised SkipTest shows up as an
    # _ErrorHolder whose description is "setUpClass (__main__.Class)".
    name = test.id() if isinstance(test, unittest.TestCase) else str(test)
    return name.replace("__main__.", "")


def exit_code(result):
    """The exit code for a finished unittest result, printing its skips."""
    whole_tests_skipped = 0
    for test, reason in result.skipped:
        print("SKIP: %s: %s" % (_name(test), reason))
        # Class-level skips and skipped subtests are not counted in testsRun.
        if isinstance(test, unittest.TestCase) and type(test).__name__ != "_SubTest":
            whole_tests_skipped += 1
    ran = result.testsRun - whole_tests_skipped
    if not result.wasSuccessful():
        return 1
    if ran > 0:
        return 0
    if result.skipped:
        print("SKIP: nothing ran (%d skip%s above)" %
              (len(result.skipped), "" if len(result.skipped) == 1 else "s"))
        return SKIP
    print("no test found")
    return 1


def main():
    """unittest.main for the calling script, then sys.exit(exit_code)."""
    prog = unittest.main(exit=False, verbosity=2)
    sys.stderr.flush()
    code = exit_code(prog.result)
    for line in _notes:
        print(line)
    sys.stdout.flush()
    sys.exit(code)
