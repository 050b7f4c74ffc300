"""tests/static/thread_safety.py finds a guarded member read without its
mutex, and passes the same file once the read holds it (real clang++ on a
real file; skipped without clang)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHECK = os.path.join(HERE, "thread_safety.py")

SOURCE = """#include "common/mutex.h"
struct Counter {
  asyncps::Mutex mu;
  int n GUARDED_BY(mu) = 0;
  int Get() { %s return n; }
};
int main() { Counter c; return c.Get(); }
"""


class ThreadSafetyCheckTest(unittest.TestCase):
    def run_on(self, body):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        src = os.path.join(d, "counter.cc")
        with open(src, "w") as f:
            f.write(SOURCE % body)
        with open(os.path.join(d, "compile_commands.json"), "w") as f:
            json.dump([{"directory": d, "file": src,
                        "command": "/usr/bin/c++ -I%s -std=c++17 -o counter.o -c %s" % (REPO, src)}], f)
        return subprocess.run([sys.executable, CHECK, d], capture_output=True, text=True)

    def test_unguarded_read_fails_guarded_read_passes(self):
        if shutil.which("clang++") is None and shutil.which("clang++-14") is None:
            self.skipTest("clang++ not installed")
        bad = self.run_on("")
        self.assertEqual(bad.returncode, 1, bad.stdout + bad.stderr)
        self.assertIn("requires holding mutex", bad.stdout)
        good = self.run_on("asyncps::MutexLock l(&mu);")
        self.assertEqual(good.returncode, 0, good.stdout + good.stderr)


if __name__ == "__main__":
    if shutil.which("clang++") is None and shutil.which("clang++-14") is None:
        print("clang++ not installed (Debian's clang): skipped")
        sys.exit(77)
    unittest.main()
