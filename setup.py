"""pip install . : the CMake build step of the asyncps Python package.

pyproject.toml has the metadata; this file adds build_ext, which configures
and builds this repository with CMake (Release, the targets below only) and
puts the result into the package:

    asyncps/_asyncps.<EXT_SUFFIX>       the pybind11 module (worker/python)
    asyncps/bin/ps_server, ps_worker, ps_ctl
                                        the binaries, which the console scripts
                                        of the same names run (pslaunch/binaries.py)

Environment:
    ASYNCPS_CMAKE_BUILD_DIR  a build tree to configure (if new) and build in,
                             e.g. the checkout's build/ (CI installs from the
                             tree its tests ran in, compiling nothing twice);
                             default: a tree under setuptools' build folder
    ASYNCPS_CMAKE_ARGS       more configure arguments (-DASYNCPS_ENABLE_CUDA=OFF ...)
    CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: the CPU count)

The module fits the CPython it is built with (its EXT_SUFFIX, Debian 12's
cpython-311-x86_64-linux-gnu): build_ext refuses a tree built for another.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
BINARIES = ("ps_server", "ps_worker", "ps_ctl")
TARGETS = ("_asyncps",) + BINARIES


def version():
    """project(asyncps VERSION x.y.z) of CMakeLists.txt, the one version."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(asyncps VERSION ([0-9.]+)", f.read())
    return m.group(1)


class CMakeBuild(build_ext):
    """Builds the CMake targets and copies the module and the binaries next to
    where setuptools wants the extension (build/lib..., or the source package
    for an in-place or editable build)."""

    def build_extension(self, ext):
        tree = os.path.abspath(os.environ.get("ASYNCPS_CMAKE_BUILD_DIR") or
                               os.path.join(self.build_temp, "cmake"))
        if not os.path.isfile(os.path.join(tree, "CMakeCache.txt")):
            args = ["cmake", "-S", ROOT, "-B", tree, "-DCMAKE_BUILD_TYPE=Release",
                    "-DPython3_EXECUTABLE=" + sys.executable]
            if shutil.which("ninja"):
                args += ["-G", "Ninja"]
            self._run(args + shlex.split(os.environ.get("ASYNCPS_CMAKE_ARGS", "")))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        self._run(["cmake", "--build", tree, "-j", jobs, "--target"] + list(TARGETS))
        module = os.path.join(tree, "python", "asyncps",
                              "_asyncps" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not os.path.isfile(module):
            built = [n for n in os.listdir(os.path.dirname(module)) if n.startswith("_asyncps")]
            raise SystemExit("setup.py: %s has no %s for this Python (%s %s); it holds %s. Build "
                             "with the Python the tree was configured for, or another tree "
                             "(ASYNCPS_CMAKE_BUILD_DIR)" % (tree, os.path.basename(module),
                                                            sys.executable,
                                                            sys.version.split()[0], built))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(module, dest)
        bin_dir = os.path.join(os.path.dirname(dest), "bin")
        os.makedirs(bin_dir, exist_ok=True)
        for name in BINARIES:
            shutil.copy2(os.path.join(tree, "bin", name), os.path.join(bin_dir, name))

    def copy_extensions_to_source(self):
        """In-place and editable builds (pip install -e .): the binaries go
        beside the module in the source package too (worker/python/asyncps/bin)."""
        super().copy_extensions_to_source()
        inplace, regular = self._get_inplace_equivalent(self.get_finalized_command("build_py"),
                                                        self.extensions[0])
        src, dst = (os.path.join(os.path.dirname(f), "bin") for f in (regular, inplace))
        os.makedirs(dst, exist_ok=True)
        for name in BINARIES:
            self.copy_file(os.path.join(src, name), os.path.join(dst, name))

    def _run(self, argv):
        print("setup.py: " + " ".join(shlex.quote(a) for a in argv), flush=True)
        subprocess.run(argv, check=True)


# setuptools' own build folder: not build/, the checkout's CMake tree.
os.makedirs(os.path.join(ROOT, "build-pip"), exist_ok=True)
setup(version=version(),
      ext_modules=[Extension("asyncps._asyncps", sources=[])],
      cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}})
