"""The Colab way for nbval: how `pytest --nbval` runs every page (the root conftest.py calls it).

`mgpu_lib` is installed non-editable into a temporary folder, as pip does in Colab
(`MGPU_COLAB_SITE` names an existing install instead); each kernel starts in an empty folder
holding only a copy of its notebook, with that install alone on `PYTHONPATH`. A page then fails
if it reads the repository (`../results`), if it imported `mgpu_lib` from anywhere else, or if it
says a recorded file "was not found"; a cell past `--nbval-cell-timeout` fails naming its page
and cell. One execution checks all that and nbval's output comparison.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MISSING = re.compile(r"\b(was|were) not found")   # what a page prints for a missing record
ORIGIN = ("import sys; m = sys.modules.get('mgpu_lib'); "
          "assert m is None or m.__file__.startswith({site!r}), "
          "'mgpu_lib came from ' + m.__file__")


def install_site(target: Path) -> Path:
    """`mgpu_lib` installed non-editable into `target`, as pip does in Colab."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    return target


def configure(config) -> None:
    """With --nbval, install the package and patch nbval to run each page the Colab way."""
    if not (getattr(config.option, "nbval", False) or getattr(config.option, "nbval_lax", False)):
        return
    from nbval import plugin
    base = Path(tempfile.mkdtemp(prefix="mgpu-colab-"))
    config.add_cleanup(lambda: shutil.rmtree(base, ignore_errors=True))
    site = os.environ.get("MGPU_COLAB_SITE") or str(install_site(base / "site"))
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        os.environ["MGPU_COLAB_SITE"] = site     # pytest-xdist's controller: its workers,
        return                                   # started next, use this one install
    os.environ["PYTHONPATH"] = site      # the kernels inherit it: the install, nothing else
    config.add_cleanup(patch_nbval(plugin, base, site))


def patch_nbval(plugin, base: Path, site: str):
    """Start each kernel in an empty folder; check each cell's outputs and the import's origin.
    Returns the function that undoes the patch."""
    nb_setup, cell_runtest, nb_teardown = (plugin.IPyNbFile.setup, plugin.IPyNbCell.runtest,
                                           plugin.IPyNbFile.teardown)
    kernel_class = plugin.RunningKernel

    def setup(self):
        folder = Path(tempfile.mkdtemp(prefix=self.path.stem + "-", dir=base))
        shutil.copy(self.path, folder)
        plugin.RunningKernel = lambda name, cwd=None, **kw: kernel_class(name, cwd=str(folder),
                                                                         **kw)
        try:
            nb_setup(self)
        finally:
            plugin.RunningKernel = kernel_class

    def runtest(self):
        page = self.parent.path.name
        try:
            cell_runtest(self)
        except plugin.NbCellError as e:
            if str(e).startswith("Timeout"):
                self.raise_cell_error(f"{page}, cell {self.cell_num}: {e}")
            raise
        text = "\n".join(str(o) for o in self.test_outputs or [])
        if MISSING.search(text):
            self.raise_cell_error(f"{page}: a recorded file is missing: "
                                  f"{MISSING.search(text).group(0)!r} in its output")

    def teardown(self):
        kernel = self.kernel
        if kernel is not None and kernel.is_alive():
            reply = kernel.kc.execute_interactive(ORIGIN.format(site=site), timeout=60,
                                                  output_hook=lambda msg: None)
            if reply["content"]["status"] != "ok":
                nb_teardown(self)
                raise AssertionError(f"{self.path.name}: mgpu_lib was not imported from the "
                                     f"installed copy in {site}: {reply['content']['evalue']}")
        nb_teardown(self)

    def undo():
        plugin.IPyNbFile.setup, plugin.IPyNbCell.runtest = nb_setup, cell_runtest
        plugin.IPyNbFile.teardown = nb_teardown

    plugin.IPyNbFile.setup, plugin.IPyNbCell.runtest = setup, runtest
    plugin.IPyNbFile.teardown = teardown
    return undo
