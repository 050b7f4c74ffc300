#!/usr/bin/env python3
"""A shard that never comes up: a clear error naming it, its log tail, no orphans."""
import os
import socket
import subprocess

import launch_test_util as u


class StartTimeoutTest(u.LaunchTestCase):
    def run_psrun(self, argv):
        out = os.path.join(self.tmp.name, "psrun.out")
        with open(out, "wb") as f:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=60).returncode
        return rc, self.output()

    def test_shard_that_never_writes_its_ready_file(self):
        fake_bin = os.path.join(self.tmp.name, "bin")
        os.makedirs(fake_bin)
        for n in ("ps_worker", "ps_ctl"):
            os.symlink(os.path.join(u.bin_dir(), n), os.path.join(fake_bin, n))
        with open(os.path.join(fake_bin, "ps_server"), "w") as f:
            f.write("#!/bin/sh\necho \"fake ps_server: stuck before binding, pid $$\"\n"
                    "exec sleep 1000\n")
        os.chmod(os.path.join(fake_bin, "ps_server"), 0o755)
        argv = u.psrun_argv(self.run_dir, servers=2, bin_dir_=fake_bin,
                            extra=["--start_timeout", "2"]) + ["--max_steps=5"]
        rc, text = self.run_psrun(argv)
        self.assertEqual(rc, 1, text)
        self.assertIn("FAILED server-0: did not become ready within 2s", text)
        self.assertIn("fake ps_server: stuck before binding", text)  # the log tail
        pids = u.read_pids(self.run_dir)
        self.assertFalse(os.path.exists(os.path.join(self.run_dir, "worker-0.log")))
        u.assert_no_orphans(self, pids)

    def test_shard_that_cannot_bind(self):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            port = s.getsockname()[1]
            argv = u.psrun_argv(self.run_dir, server_flags=u.TINY_SERVER +
                                " --endpoint=tcp://127.0.0.1:%d" % port) + ["--max_steps=5"]
            rc, text = self.run_psrun(argv)
        self.assertEqual(rc, 1, text)
        self.assertIn("FAILED server-0: exited before it was ready (exit code", text)
        self.assertIn("server-0.log", text)
        u.assert_no_orphans(self, u.read_pids(self.run_dir))


if __name__ == "__main__":
    u.main()
