"""tests/static/format_check.py fails on a file clang-format would change and
passes once the file is formatted (real clang-format on a real tree; skipped
without clang-format)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHECK = os.path.join(HERE, "format_check.py")


class FormatCheckTest(unittest.TestCase):
    def run_on(self, text, extra=()):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        shutil.copy(os.path.join(REPO, ".clang-format"), d)
        os.makedirs(os.path.join(d, "common"))
        with open(os.path.join(d, "common", "f.cc"), "w") as f:
            f.write(text)
        r = subprocess.run([sys.executable, CHECK, "--root", d, *extra],
                           capture_output=True, text=True)
        if r.returncode == 77:
            raise unittest.SkipTest("clang-format not installed")
        return r, d

    def test_unformatted_file_fails_and_is_named(self):
        r, _ = self.run_on("int  f( int x ){return x+1;}\n")
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("common/f.cc is not clang-formatted", r.stdout)

    def test_formatted_file_passes(self):
        r, _ = self.run_on("int f(int x) { return x + 1; }\n")
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("1 of 1 C++ files formatted", r.stdout)

    def test_fix_then_check_passes(self):
        r, d = self.run_on("int  f( int x ){return x+1;}\n", ["--fix"])
        self.assertEqual(r.returncode, 0, r.stdout)
        r = subprocess.run([sys.executable, CHECK, "--root", d], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout)


if __name__ == "__main__":
    if shutil.which("clang-format") is None and shutil.which("clang-format-14") is None:
        print("clang-format not installed: skipped")
        sys.exit(77)
    unittest.main()
