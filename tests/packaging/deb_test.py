#!/usr/bin/env python3
"""The Debian package: cpack -G DEB in the build tree (into a temp folder),
then its control fields and file list (dpkg-deb -I / -c), then the package
unpacked with dpkg -x into a temp root and run from there only (its usr/bin
first on PATH, its dist-packages the only PYTHONPATH entry): ps_server --help,
import asyncps, and a psrun training run, 1 shard x 1 worker, 40 steps, that
must find its binaries in the unpacked usr/bin (no --bin_dir).

Exit 77 (skipped) without cpack, dpkg-deb or dpkg-shlibdeps (dpkg-dev), the
built binaries, or Fashion-MNIST (the training case only)."""
import glob
import os
import shutil
import subprocess
import tempfile
import unittest

import packaging_test_util as p
import unittest_main
from unittest_main import note

DIST = os.path.join("usr", "lib", "python3", "dist-packages")


class DebPackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for tool in ("cpack", "dpkg-deb", "dpkg-shlibdeps"):
            if not shutil.which(tool):
                raise unittest.SkipTest("%s not found (cmake, dpkg-dev)" % tool)
        if not os.access(os.path.join(p.BUILD, "bin", "ps_server"), os.X_OK):
            raise unittest.SkipTest("ps_server is not built in %s" % p.BUILD)
        cls.tmp = tempfile.TemporaryDirectory(prefix="asyncps-deb-")
        out = os.path.join(cls.tmp.name, "out")
        r = subprocess.run(["cpack", "-G", "DEB", "-B", out, "--config",
                            os.path.join(p.BUILD, "CPackConfig.cmake")], cwd=p.BUILD,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=300)
        debs = glob.glob(os.path.join(out, "asyncps_*_amd64.deb"))
        if r.returncode != 0 or len(debs) != 1:
            cls.tmp.cleanup()
            raise AssertionError("cpack -G DEB (%d) made %s:\n%s" % (r.returncode, debs, r.stdout))
        cls.deb = debs[0]
        cls.root = os.path.join(cls.tmp.name, "root")
        subprocess.run(["dpkg", "-x", cls.deb, cls.root], check=True)
        cls.env = p.clean_env([os.path.join(cls.root, "usr", "bin")],
                              pythonpath=os.path.join(cls.root, DIST))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_control(self):
        info = subprocess.run(["dpkg-deb", "-I", self.deb], capture_output=True, text=True,
                              check=True).stdout
        fields = dict(l.strip().split(": ", 1) for l in info.splitlines()
                      if ": " in l and not l.startswith("  "))
        self.assertEqual(fields["Package"], "asyncps")
        self.assertEqual(fields["Architecture"], "amd64")
        depends = fields["Depends"]
        for lib in ("libzmq5", "librocksdb", "libgflags", "libgoogle-glog", "libcapnp",
                    "libopenblas", "libc6", "python3 (>= 3.", "python3-numpy"):
            self.assertIn(lib, depends)
        self.assertIn("python3-torch", fields.get("Suggests", "") + fields.get("Recommends", ""))
        note("Depends: %s" % depends)
        note("%s: %d bytes" % (os.path.basename(self.deb), os.path.getsize(self.deb)))

    def test_contents(self):
        listing = subprocess.run(["dpkg-deb", "-c", self.deb], capture_output=True, text=True,
                                 check=True).stdout
        paths = {l.split()[-1].lstrip(".") for l in listing.splitlines()}
        for want in ("/usr/bin/ps_server", "/usr/bin/ps_worker", "/usr/bin/ps_ctl",
                     "/usr/bin/psrun", "/usr/bin/psstudy",
                     "/%s/asyncps/__init__.py" % DIST, "/%s/asyncps/torch.py" % DIST,
                     "/%s/pslaunch/cli.py" % DIST, "/%s/psstudy_lib/cli.py" % DIST,
                     "/usr/share/asyncps/configs/fashion_ssp.flags"):
            self.assertIn(want, paths)
        self.assertTrue([x for x in paths if x.startswith("/%s/asyncps/_asyncps.cpython-" % DIST)],
                        listing)
        self.assertFalse([x for x in paths if "__pycache__" in x or x.endswith(".pyc")
                          or x.startswith("/%s/asyncps/bin" % DIST)])
        with open(os.path.join(self.root, "usr", "bin", "psrun")) as f:
            self.assertEqual(f.readline().strip(), "#!/usr/bin/python3")

    def test_run_unpacked(self):
        code, out = p.run(["ps_server", "--help"], self.env, self.tmp.name)
        self.assertIn("one shard of the asyncps parameter server", out[:2000])
        code, out = p.run(["psrun", "--help"], self.env, self.tmp.name)
        self.assertEqual(code, 0, out)
        code, out = p.run(["/usr/bin/python3", "-c", "import asyncps; print(asyncps.__file__)"],
                          self.env, self.tmp.name)
        self.assertEqual(code, 0, out)
        self.assertIn(self.root, out)
        if not os.path.isdir(p.DATA):
            self.skipTest("no Fashion-MNIST in %s (dataset-fashion-mnist)" % p.DATA)
        summary, bin_dir = p.train(self, "psrun", self.env, self.tmp.name)
        self.assertEqual(bin_dir, os.path.join(self.root, "usr", "bin"))
        note("unpacked .deb psrun: 40 steps, test accuracy %.3f"
             % summary["totals"]["final_test_acc"])


if __name__ == "__main__":
    unittest_main.main()
