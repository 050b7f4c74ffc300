"""pslaunch: the library behind launch/psrun (Python 3 standard library only).

Modules:
  config   experiment flag files with [server] / [worker] / [psrun] sections
  binaries where the ps_server / ps_worker / ps_ctl binaries are, and whether they are there
  procs    one launched process (local or over SSH), hostfiles and placement
  member   a fleet's member (one logical process) and LaunchError, which names one
  fleet    start shards, wait for readiness, start workers, watch, restart, tear down
  elastic  psrun --elastic: shards join and leave while the fleet trains
  summary  SUMMARY-line parsing, the run summary and the progress display
  slurm    srun/sbatch rendering and the Slurm backend
  k8s      Kubernetes manifest rendering
  netns    emulated hosts: network namespaces joined by tc-shaped links (--emulate_hosts)

Import root: launch/, beside pslaunch and psstudy_lib. launch/psrun, psstudy
and psmon find them because Python puts the folder of the script it runs
first on sys.path. Anything else puts launch/ there itself: ctest and
launch/slurm/task.sh (`python3 -m pslaunch.etcd_tls`) through PYTHONPATH, a
script of experiments/ in one statement at its top (experiments/expkit/
__init__.py). No module of either package edits sys.path, and none imports a
module that imports it back (tests/launch/import_cycles_test.py). Installed
(pip install . with setup.py, or the Debian package) both are ordinary
packages of site-packages / dist-packages, with psrun and psstudy as commands.
"""
