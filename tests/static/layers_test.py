"""tests/static/layers.py refuses an include of a higher layer and passes the
same tree once the include goes downward (a real git tree in a temp dir)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "layers.py")


class LayersCheckTest(unittest.TestCase):
    def tree(self, files):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        for path, text in files.items():
            os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(d, path), "w") as f:
                f.write(text)
        subprocess.run(["git", "init", "-q", d], check=True)
        subprocess.run(["git", "-C", d, "add", "-A"], check=True)
        return subprocess.run([sys.executable, CHECK, "--root", d], capture_output=True,
                              text=True)

    def test_shard_including_elastic_is_refused(self):
        r = self.tree({"server/elastic/doc.h": "#pragma once\n",
                       "server/shard/shard.cc": '#include "server/elastic/doc.h"\n'})
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("server/shard/shard.cc:1: server/shard includes server/elastic", r.stdout)

    def test_common_including_server_and_worker_including_server_are_refused(self):
        r = self.tree({"server/store/store.h": "#pragma once\n",
                       "common/a.h": '#include "server/store/store.h"\n',
                       "worker/b.cc": '#include "server/store/store.h"\n'})
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("common/a.h:1: common includes server/store", r.stdout)
        self.assertIn("worker/b.cc:1: worker includes server/store", r.stdout)

    def test_downward_includes_and_tests_pass(self):
        r = self.tree({"server/shard/shard.h": "#pragma once\n",
                       "common/status.h": "#pragma once\n",
                       "server/elastic/coordinator.cc":
                           '#include "server/shard/shard.h"\n#include "common/status.h"\n',
                       "server/elastic/x.h": "#pragma once\n",
                       "server/shard/shard_test.cc": '#include "server/elastic/x.h"\n'})
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("0 includes against the layer order", r.stdout)


if __name__ == "__main__":
    unittest.main()
