#!/usr/bin/env python3
"""pip install . into a fresh venv, reusing the build tree (nothing compiled
twice: setup.py's ASYNCPS_CMAKE_BUILD_DIR), then only the venv's commands:

  - psrun --help, ps_server --help from the venv's bin (on PATH)
  - import asyncps with torch made unimportable (a sitecustomize on
    PYTHONPATH that refuses it), and import asyncps.torch failing there with
    the ImportError that names what to install
  - psrun --config fashion_ssp (the installed copy), 1 shard x 1 worker,
    40 steps, which must find ps_server/ps_worker/ps_ctl in the installed
    package (no --bin_dir) and succeed

Exit 77 (skipped) without the built module and binaries, the venv module, or
Fashion-MNIST (the training case only)."""
import glob
import os
import subprocess
import sys
import tempfile
import unittest

import packaging_test_util as p
import unittest_main
from unittest_main import note

HIDE_TORCH = '''import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch' (hidden by pip_test.py)", name=name)
sys.meta_path.insert(0, _NoTorch())
'''


class PipInstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        built = glob.glob(os.path.join(p.BUILD, "python", "asyncps", "_asyncps*.so"))
        if not built or not all(os.access(os.path.join(p.BUILD, "bin", n), os.X_OK)
                                for n in ("ps_server", "ps_worker", "ps_ctl")):
            raise unittest.SkipTest("the module and binaries are not built in %s" % p.BUILD)
        cls.tmp = tempfile.TemporaryDirectory(prefix="asyncps-pip-")
        cls.venv = os.path.join(cls.tmp.name, "venv")
        # Debian's pip and setuptools from the system site (no ensurepip: faster).
        r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                            "--without-pip", cls.venv], capture_output=True, text=True)
        if r.returncode != 0:
            raise unittest.SkipTest("python3 -m venv failed (python3-venv?): %s" % r.stderr)
        cls.bin = os.path.join(cls.venv, "bin")
        env = p.clean_env([cls.bin], ASYNCPS_CMAKE_BUILD_DIR=p.BUILD,
                          PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        code, out = p.run([os.path.join(cls.bin, "python"), "-m", "pip", "install",
                           "--no-build-isolation", "--no-deps", p.SOURCE], env,
                          cls.tmp.name, timeout=600)
        if code != 0:
            cls.tmp.cleanup()
            raise AssertionError("pip install failed:\n" + out)
        cls.env = p.clean_env([cls.bin])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def cmd(self, name):
        return os.path.join(self.bin, name)

    def test_commands_on_path(self):
        for name in ("psrun", "psstudy", "ps_server", "ps_worker", "ps_ctl"):
            self.assertTrue(os.access(self.cmd(name), os.X_OK), name)
        code, out = p.run(["psrun", "--help"], self.env, self.tmp.name)
        self.assertEqual(code, 0, out)
        self.assertIn("--servers", out)
        code, out = p.run(["psstudy", "--help"], self.env, self.tmp.name)
        self.assertEqual(code, 0, out)
        # gflags' --help exits 1 after printing the flags.
        code, out = p.run(["ps_server", "--help"], self.env, self.tmp.name)
        self.assertIn("one shard of the asyncps parameter server", out[:2000])

    def test_import_without_torch(self):
        hide = os.path.join(self.tmp.name, "hide_torch")
        os.makedirs(hide, exist_ok=True)
        with open(os.path.join(hide, "sitecustomize.py"), "w") as f:
            f.write(HIDE_TORCH)
        env = p.clean_env([self.bin], pythonpath=hide)
        python = self.cmd("python")
        code, out = p.run([python, "-c", "import asyncps, sys; "
                           "assert 'torch' not in sys.modules; print(asyncps.__file__)"],
                          env, self.tmp.name)
        self.assertEqual(code, 0, out)
        self.assertIn(os.path.join(self.venv, "lib"), out)  # the installed copy
        code, out = p.run([python, "-c", "import asyncps.torch"], env, self.tmp.name)
        self.assertNotEqual(code, 0, out)
        self.assertIn("ImportError: asyncps.torch needs PyTorch", out)
        self.assertIn("pip install 'asyncps[torch]'", out)

    def test_train_from_venv(self):
        if not os.path.isdir(p.DATA):
            self.skipTest("no Fashion-MNIST in %s (dataset-fashion-mnist)" % p.DATA)
        summary, bin_dir = p.train(self, "psrun", self.env, self.tmp.name)
        self.assertTrue(bin_dir.startswith(self.venv), bin_dir)
        self.assertTrue(bin_dir.endswith(os.path.join("asyncps", "bin")), bin_dir)
        note("venv psrun: 40 steps, test accuracy %.3f, binaries from %s"
             % (summary["totals"]["final_test_acc"], bin_dir))


if __name__ == "__main__":
    unittest_main.main()
