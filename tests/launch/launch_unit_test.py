#!/usr/bin/env python3
"""psrun's pure parts: flag-file sections, hostfiles, placement, SUMMARY parsing."""
import contextlib
import io
import os

import launch_test_util as u

from pslaunch import binaries, cli, config, netns, procs, summary


class ConfigTest(u.LaunchTestCase):
    needs_binaries = False

    def test_sections_and_prefixes(self):
        c = config.parse_config_text(
            "# c\n[psrun]\n--servers=2\n[server]\n--lr=0.1\n  # x\nworker: --batch=8\n"
            "[worker]\n--epochs=3\nserver: --staleness=2\n")
        self.assertEqual(c["psrun"], ["--servers=2"])
        self.assertEqual(c["server"], ["--lr=0.1", "--staleness=2"])
        self.assertEqual(c["worker"], ["--batch=8", "--epochs=3"])

    def test_errors_name_the_line(self):
        for text, needle in (("--lr=1\n", ":1: '--lr=1' is outside"),
                             ("[srv]\n", "unknown section [srv]"),
                             ("[server]\nlr=1\n", ":2: expected --flag=value"),
                             ("[server]\nfoo: --x=1\n", "unknown prefix 'foo:'")):
            with self.assertRaises(config.ConfigError) as e:
                config.parse_config_text(text, "f.flags")
            self.assertIn(needle, str(e.exception))

    def test_shipped_configs_parse(self):
        d = os.path.join(u.REPO, "launch", "configs")
        names = sorted(os.listdir(d))
        for n in ("fashion_bsp.flags", "fashion_ssp.flags", "fashion_asp.flags",
                  "fashion_topk.flags"):
            self.assertIn(n, names)
        for n in names:
            c = config.parse_config_file(os.path.join(d, n))
            self.assertTrue(c["server"] and c["worker"], n)
        ssp = config.parse_config_file(os.path.join(d, "fashion_ssp.flags"))
        self.assertIn("--consistency=ssp", ssp["server"])
        self.assertIn("--staleness=2", ssp["server"])

    def test_bare_config_names(self):
        # A bare name is one of launch/configs here, the installed copy elsewhere.
        d = os.path.join(u.REPO, "launch", "configs")
        for name in ("fashion_ssp", "fashion_ssp.flags"):
            self.assertEqual(config.find_config(name), os.path.join(d, "fashion_ssp.flags"))
        self.assertEqual(config.find_config("no_such_config"), "no_such_config")
        self.assertEqual(config.find_config("./fashion_ssp"), "./fashion_ssp")  # a path: as given

    def test_default_bin_dir_order(self):
        env = {k: os.environ.pop(k) for k in ("ASYNCPS_BIN_DIR", "BUILD") if k in os.environ}
        try:
            os.environ["BUILD"] = "/b"
            self.assertEqual(binaries.default_bin_dir(), "/b/bin")
            os.environ["ASYNCPS_BIN_DIR"] = "/x"
            self.assertEqual(binaries.default_bin_dir(), "/x")
        finally:
            for k in ("ASYNCPS_BIN_DIR", "BUILD"):
                os.environ.pop(k, None)
            os.environ.update(env)
        # A console script named ps_server on PATH (pip's) is no binary folder.
        fake = os.path.join(self.tmp.name, "ps_server")
        with open(fake, "w") as f:
            f.write("#!/usr/bin/python3\n")
        os.chmod(fake, 0o755)
        path = os.environ["PATH"]
        os.environ["PATH"] = self.tmp.name
        try:
            self.assertIsNone(binaries.path_bin_dir())
        finally:
            os.environ["PATH"] = path

    def test_cli_precedence(self):
        path = os.path.join(self.tmp.name, "c.flags")
        with open(path, "w") as f:
            f.write("[psrun]\n--servers=3\n--workers=5\n--max_restarts=2\n")
        opts, cfg = cli.parse_args(["--config", path, "--workers", "2", "--server_flags",
                                    "--lr=0.5 --durable", "--", "--max_steps=9"])
        self.assertEqual((opts.servers, opts.workers, opts.max_restarts), (3, 2, 2))
        self.assertEqual(opts.server_flags, "--lr=0.5 --durable")
        self.assertEqual(opts.worker_extra, ["--max_steps=9"])
        self.assertEqual(opts.grace, 5.0)

    def test_run_dir_with_a_comma_is_refused(self):
        # gflags splits --flagfile=<run_dir>/flags/... at commas (issue 13).
        run_dir = os.path.join(self.tmp.name, "a,b")
        rc = cli.main(["--run_dir", run_dir, "--servers", "1", "--workers", "1"])
        self.assertEqual(rc, 2)
        self.assertFalse(os.path.exists(run_dir))

    def test_transport_ipc_is_local_only(self):
        opts, _ = cli.parse_args(["--transport", "ipc"])
        self.assertEqual(opts.transport, "ipc")
        self.assertEqual(cli.parse_args([])[0].transport, "tcp")
        for backend in ("ssh", "slurm", "k8s"):
            with self.assertRaises(SystemExit):
                cli.parse_args(["--transport", "ipc", "--backend", backend])

    def test_ipc_socket_paths(self):
        from pslaunch import fleet
        opts, _ = cli.parse_args(["--transport", "ipc", "--servers", "2"])
        short = fleet.Fleet(opts, os.path.join(self.tmp.name, "r"), spawn=None, log=lambda m: 0)
        self.assertEqual(short.fresh_endpoint(short.shards[1]),
                         "ipc://" + os.path.join(self.tmp.name, "r", "sock", "server-1"))
        self.assertIsNone(short.short_sock_dir)
        # A run folder too deep for a Unix socket address (107 bytes): the
        # sockets go to a folder of psrun's own, removed when the run ends.
        deep = os.path.join(self.tmp.name, "d" * 120)
        logged = []
        f = fleet.Fleet(opts, deep, spawn=None, log=logged.append)
        ep = f.fresh_endpoint(f.shards[0])
        self.assertTrue(ep.startswith("ipc://"), ep)
        self.assertLessEqual(len(ep) - len("ipc://"), 107)
        self.assertTrue(os.path.isdir(f.short_sock_dir))
        self.assertEqual(f.fresh_endpoint(f.shards[1]),
                         "ipc://" + os.path.join(f.short_sock_dir, "server-1"))
        self.assertIn("too long for a Unix socket address", logged[0])
        os.rmdir(f.short_sock_dir)
        opts.transport = "tcp"
        self.assertEqual(short.fresh_endpoint(short.shards[0]), "tcp://127.0.0.1:*")

    def test_etcd_tls_choice(self):
        """--etcd_tls auto is on exactly when the shards get a CurveZMQ key
        and psrun would start etcd itself; on is refused with --etcd and on
        k8s."""
        path = os.path.join(self.tmp.name, "c.flags")
        with open(path, "w") as f:
            f.write("[server]\n--curve_secret_key=/keys/server.key\n")
        psrun_on = os.path.join(self.tmp.name, "on.flags")
        with open(psrun_on, "w") as f:
            f.write("[psrun]\n--etcd_tls=on\n")
        curve = ["--server_flags", "--lr=0.1 --curve_secret_key=/k"]
        for argv, choice, on in (([], "auto", False),
                                 (curve, "auto", True),
                                 (["--config", path], "auto", True),
                                 (["--etcd_tls", "off"] + curve, "off", False),
                                 (["--etcd_tls", "on"], "on", True),
                                 (["--config", psrun_on], "on", True),
                                 (["--etcd", "http://127.0.0.1:2379"] + curve, "auto", False),
                                 (["--backend", "k8s"] + curve, "auto", False),
                                 (["--backend", "slurm", "--etcd_tls", "on"], "on", True)):
            opts, _ = cli.parse_args(argv)
            self.assertEqual((opts.etcd_tls, opts.etcd_tls_on), (choice, on), argv)
        for argv, why in ((["--etcd_tls", "on", "--etcd", "http://127.0.0.1:2379"],
                           "with --etcd give the etcd's --etcd_ca_file"),
                          (["--etcd_tls", "on", "--backend", "k8s"], "not with --backend k8s"),
                          (["--etcd_tls", "yes"], "invalid choice")):
            err = io.StringIO()
            with self.assertRaises(SystemExit, msg=argv), contextlib.redirect_stderr(err):
                cli.parse_args(argv)
            self.assertIn(why, err.getvalue())

    def fleet(self, argv):
        """A Fleet (nothing started) of psrun `argv`, its run folder written."""
        from pslaunch import fleet
        opts, cfg = cli.parse_args(["--run_dir", os.path.join(self.tmp.name, "r"),
                                    "--bin_dir", "/b"] + argv)
        cli.prepare_run_dir(opts, cfg)
        f = fleet.Fleet(opts, opts.run_dir, spawn=None, log=lambda m: 0)
        for i, m in enumerate(f.shards):
            m.endpoint = "tcp://127.0.0.1:%d" % (5000 + i)
        return f

    def test_etcd_credentials_per_process(self):
        """--etcd_tls on: every ps_server and psrun's ps_ctl get the
        asyncps-server user's files, workers the asyncps-worker user's only
        when they are given etcd (--elastic); off: none of them."""
        tls = os.path.join(self.tmp.name, "r", "etcd", "tls")

        def user_files(user):
            return ["--etcd_ca_file=%s/ca.pem" % tls, "--etcd_cert_file=%s/%s.pem" % (tls, user),
                    "--etcd_key_file=%s/%s.key" % (tls, user), "--etcd_user=" + user,
                    "--etcd_password_file=%s/%s.password" % (tls, user)]

        def etcd_flags(argv):
            return [a for a in argv if a.startswith("--etcd_") and not
                    a.startswith("--etcd_prefix")]

        server, worker = user_files("asyncps-server"), user_files("asyncps-worker")
        keys = ["--curve_server_key=/k/server.pub", "--curve_secret_key=/k/worker.key"]
        f = self.fleet(["--replicas", "2", "--etcd_tls", "on", "--ctl_flags",
                        "--curve_secret_key=/k/admin.key", "--server_flags",
                        "--curve_secret_key=/k/server.key", "--"] + keys + ["--batch=8"])
        f.etcd_endpoints = "https://127.0.0.1:2379"
        argv = f.shard_argv(f.shards[1], "tcp://127.0.0.1:*")
        self.assertEqual(etcd_flags(argv), server)
        self.assertIn("--etcd=https://127.0.0.1:2379", argv)
        self.assertEqual(etcd_flags(f.worker_argv(f.workers[0])), [])  # no etcd, no files
        # psrun's ps_ctl: the workers' CURVE keys, the server user, --ctl_flags last.
        self.assertEqual(f.ctl_flags(), keys + server + ["--curve_secret_key=/k/admin.key"])
        # Shards without CURVE: the workers' keys are not psrun's business.
        f = self.fleet(["--replicas", "2", "--etcd_tls", "on", "--"] + keys)
        self.assertEqual(f.ctl_flags(), server)

        f = self.fleet(["--servers", "2", "--elastic", "+1@1s", "--etcd_tls", "on"])
        f.etcd_endpoints = "https://127.0.0.1:2379"
        self.assertEqual(etcd_flags(f.shard_argv(f.shards[0], "tcp://127.0.0.1:*")), server)
        argv = f.worker_argv(f.workers[0])
        self.assertEqual(etcd_flags(argv), worker)
        self.assertIn("--etcd=https://127.0.0.1:2379", argv)
        self.assertEqual(f.ctl_flags(), server)
        f.o.worker_cmd = "python3 train.py"
        env = dict(a.split("=", 1) for a in f.worker_argv(f.workers[0])[1:] if "=" in a
                   and a.startswith("ASYNCPS_"))
        self.assertEqual((env["ASYNCPS_ETCD_USER"], env["ASYNCPS_ETCD_PASSWORD_FILE"],
                          env["ASYNCPS_ETCD_CERT_FILE"], env["ASYNCPS_ETCD"]),
                         ("asyncps-worker", tls + "/asyncps-worker.password",
                          tls + "/asyncps-worker.pem", "https://127.0.0.1:2379"))

        # off (and fleets without etcd): nothing added anywhere.
        for argv in (["--replicas", "2", "--etcd_tls", "off"], ["--etcd_tls", "on"]):
            f = self.fleet(argv)
            f.etcd_endpoints = "http://127.0.0.1:2379"
            self.assertEqual(etcd_flags(f.shard_argv(f.shards[0], "tcp://127.0.0.1:*")), [])
            self.assertEqual(etcd_flags(f.worker_argv(f.workers[0])), [])
            self.assertEqual(f.ctl_flags(), [])

        # An --etcd of the user's: psrun adds nothing; its ps_ctl takes the
        # --etcd_* flags of the server flags, the workers' come from [worker].
        config = os.path.join(self.tmp.name, "e.flags")
        with open(config, "w") as cf:
            cf.write("[server]\n--etcd_ca_file=/e/ca.pem\n[worker]\n--etcd_user=w\n"
                     "--etcd_password_file=/e/w.password\n--batch=8\n")
        f = self.fleet(["--etcd", "https://e:2379", "--elastic", "+1@1s", "--config", config,
                        "--server_flags", "--etcd_user=s --etcd_password_file=/e/s.password "
                        "--lr=0.1"])
        self.assertEqual(f.ctl_flags(), ["--etcd_ca_file=/e/ca.pem", "--etcd_user=s",
                                         "--etcd_password_file=/e/s.password"])
        self.assertEqual(etcd_flags(f.shard_argv(f.shards[0], "tcp://127.0.0.1:*")),
                         ["--etcd_user=s", "--etcd_password_file=/e/s.password"])
        f.o.worker_cmd = "python3 train.py"
        argv = f.worker_argv(f.workers[0])
        self.assertIn("ASYNCPS_ETCD_USER=w", argv)  # a variable, not an argument
        self.assertIn("ASYNCPS_ETCD_PASSWORD_FILE=/e/w.password", argv)
        self.assertIn("--batch=8", argv)
        self.assertFalse([a for a in argv if a.startswith("--etcd_")], argv)

    def test_slurm_steps_with_etcd_tls(self):
        from pslaunch import slurm
        opts, _ = cli.parse_args(["--backend", "slurm", "--replicas", "2", "--etcd_tls", "on",
                                  "--run_dir", "/r", "--server_flags", "--lr=0.1"])
        argv = slurm.etcd_step(opts, 2379, 2380, "/asyncps/r")
        self.assertEqual(argv[-4:], ["2379", "2380", "tls", "/asyncps/r"])
        self.assertEqual(slurm.etcd_step(opts, 2379, 2380)[-2:], ["2379", "2380"])
        step = slurm.server_step(opts, "https://n1:2379", "r", tls=["--etcd_user=asyncps-server"])
        self.assertLess(step.index("--etcd_user=asyncps-server"), step.index("--lr=0.1"))
        self.assertIn("--etcd=https://n1:2379", step)
        self.assertEqual(opts.server_flags, "--lr=0.1")  # the fleet's options untouched

    def test_hostfile_and_round_robin_placement(self):
        hosts = procs.parse_hostfile("# hosts\nnode1 slots=2\nnode2 slots=1 # gpu\n\nnode3\n")
        self.assertEqual(hosts, [("node1", 2), ("node2", 1), ("node3", 1)])
        self.assertEqual(procs.place(hosts, 6), ["node1", "node1", "node2", "node3",
                                                 "node1", "node1"])
        self.assertEqual(procs.place(hosts, 2, start=3), ["node3", "node1"])
        with self.assertRaises(ValueError):
            procs.parse_hostfile("node1 slots=x\n")
        with self.assertRaises(ValueError):
            procs.parse_hostfile("# nothing\n")

    def test_emulated_placement_spreads_replicas(self):
        # 3 groups x 2 replicas over 3 shard hosts (one primary on each, a
        # group's replicas apart), 4 workers over hosts 3 and 4.
        where = procs.place_emulated(5, 3, 3, 2, 4)
        self.assertEqual(where, [0, 1, 1, 2, 2, 0, 3, 4, 3, 4])
        # 2 groups x 2 replicas on 2 hosts: the primaries apart too.
        self.assertEqual(procs.place_emulated(3, 2, 2, 2, 2), [0, 1, 1, 0, 2, 2])
        # Every host shared, no replicas: shards, then workers, round-robin.
        self.assertEqual(procs.place_emulated(2, 2, 2, 1, 3), [0, 1, 0, 1, 0])

    def test_link_rates(self):
        self.assertEqual(netns.parse_rate("100mbit"), 10 ** 8)
        self.assertEqual(netns.parse_rate("1gbit"), 10 ** 9)
        self.assertEqual(netns.parse_rate("1.5Gbit"), 15 * 10 ** 8)
        self.assertEqual(netns.parse_rate("500kbit"), 5 * 10 ** 5)
        self.assertEqual(netns.format_rate(10 ** 8), "100mbit")
        self.assertEqual(netns.format_rate(15 * 10 ** 8), "1500mbit")
        for text, needle in (("100mbps", "bytes per second"), ("100", "give a unit"),
                             ("fast", "e.g. 100mbit"), ("1bit", "between 10kbit")):
            with self.assertRaises(ValueError) as e:
                netns.parse_rate(text)
            self.assertIn(needle, str(e.exception))

    def test_emulate_hosts_options(self):
        opts, _ = cli.parse_args(["--emulate_hosts", "3", "--link", "20mbit"])
        self.assertEqual(opts.link_bps, 2 * 10 ** 7)
        for argv in (["--link", "1gbit"], ["--emulate_hosts", "2", "--link", "1gbyte"],
                     ["--emulate_hosts", "2", "--backend", "ssh"],
                     ["--emulate_hosts", "2", "--transport", "ipc"],
                     ["--emulate_hosts", "2", "--shard_hosts", "3"],
                     ["--emulate_hosts", "2", "--latency", "0"]):
            with self.assertRaises(SystemExit, msg=argv):
                cli.parse_args(argv)

    def test_summary(self):
        text = ("noise\nSUMMARY rank=0 final_test_acc=0.8100 samples_per_s=100.5 "
                "bytes_pushed_raw=1000 bytes_pushed_wire=10 bytes_pulled=2000 steps=5 wall_s=1.5\n")
        s0 = summary.parse_summary_line(text)
        self.assertEqual(s0["bytes_pushed_raw"], 1000)
        self.assertAlmostEqual(s0["final_test_acc"], 0.81)
        s1 = dict(s0, rank=1, final_test_acc=-1.0)
        t = summary.aggregate({0: s0, 1: s1}, 3.0)
        self.assertAlmostEqual(t["final_test_acc"], 0.81)
        self.assertEqual(t["samples_per_s"], 201.0)
        self.assertEqual(t["compression_ratio"], 100.0)
        self.assertEqual(t["bytes_pulled"], 4000)
        self.assertIsNone(summary.parse_summary_line("no summary"))

    def test_describe_status(self):
        self.assertEqual(procs.describe_status(-9), "killed by signal 9 (SIGKILL)")
        self.assertEqual(procs.describe_status(3), "exit code 3")


if __name__ == "__main__":
    u.main()
