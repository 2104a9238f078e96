"""The env probe, run with real interpreters: this test venv, stand-in packages on PYTHONPATH, older transformers.

The facts asserted are those of the test venv (torch 2.13.0 CPU build, transformers >= 5.6, no GPU, no
causal-conv1d or fla). Stand-in packages are real files with real .dist-info metadata (what an installer writes),
found by the real importlib.metadata and imported by the real transformers; they stand in for GPU builds that
cannot exist on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging import tags as ptags
from packaging.version import Version

from builder.core.errors import ToolchainError, UsageError
from builder.stages.finalize import RECORD_FILE
from builder.user.envprobe import GDN_ROLES, EnvReport, PackageSpec, probe_env
from builder.user.probes import env as env_probe
from builder.user.probes import script
from tests.helpers import run_cli

pytestmark = pytest.mark.drift  # follows transformers: rerun against its newest release by scripts/drift-check.sh
PY = Path(sys.executable)
CAUSAL = PackageSpec("causal-conv1d", ("causal_conv1d", "causal_conv1d_cuda"))


def installed_transformers() -> Version:
    from importlib.metadata import version

    return Version(version("transformers"))


def make_dist(site: Path, name: str, version: str, files: dict[str, str], *, requires: tuple[str, ...] = (),
              record: dict[str, object] | None = None) -> None:
    """Write ``files`` and a ``name-version.dist-info`` (METADATA, RECORD, optional build record) under ``site``."""
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    listed = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    if record is not None:
        (info / RECORD_FILE).write_text(json.dumps(record))
        listed.append(f"{info.name}/{RECORD_FILE}")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in listed))


def with_path(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site)}


@pytest.fixture(scope="module")
def plain() -> EnvReport:
    return probe_env(PY, [CAUSAL, PackageSpec("torch", ("torch",))])


def test_probe_is_standalone_and_prints_one_json_object() -> None:
    """Runs with ``-I`` (no builder on sys.path, no PYTHONPATH) and writes exactly one JSON line on stdout."""
    out = subprocess.run([sys.executable, "-I", str(script("env")), "{}"], capture_output=True, text=True,
                         timeout=300, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data["errors"] == [] and data["packages"] == []
    assert "import builder" not in script("env").read_text()


def test_python_facts(plain: EnvReport) -> None:
    import platform
    import sysconfig

    assert plain.python.version == platform.python_version()
    assert plain.python.executable == PY
    assert plain.python.is_venv is (sys.prefix != sys.base_prefix)
    assert plain.python.purelib == Path(sysconfig.get_paths()["purelib"])
    assert plain.python.implementation == "cpython"
    assert plain.python.glibc == os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    assert plain.python.tags_source == "packaging"
    assert list(plain.python.tags) == [str(t) for t in ptags.sys_tags()]
    assert plain.errors == ()


def test_torch_is_the_cpu_build_without_gpus(plain: EnvReport) -> None:
    t = plain.torch
    assert t.installed and t.importable
    assert t.version is not None and t.version.startswith("2.13.0")
    assert t.cuda is None
    assert t.cuda_available is False and t.device_count == 0 and t.devices == ()
    assert t.arch_list == ()
    assert t.error is None


def test_all_four_functions_are_the_torch_fallback(plain: EnvReport) -> None:
    tf = plain.transformers
    assert tf.installed and tf.version == str(installed_transformers()) and tf.error is None
    modules = {m.module.rsplit(".", 1)[-1] for m in tf.models}
    assert "modeling_qwen3_next" in modules
    for model in tf.models:
        assert model.error is None
        assert model.layer_class is not None and model.layer_class.endswith("GatedDeltaNet")
        assert [f.role for f in model.functions] == list(GDN_ROLES)
        for f in model.functions:
            assert f.kind == "torch fallback", (model.module, f)
            assert f.text.startswith("torch fallback (")
        assert model.fast_path is False
    if installed_transformers() >= Version("5.15"):
        f = tf.models[0].function("chunk_gated_delta_rule")
        assert f.wrapper == "use_kernel_func_from_hub_with_fallback"
        assert f.qualname == "torch_chunk_gated_delta_rule"
        assert f.file is not None and f.file.name == "modeling_qwen3_next.py"


def test_missing_package(plain: EnvReport) -> None:
    p = plain.package("causal_conv1d")  # canonicalized lookup
    assert not p.installed and p.version is None and p.shared_objects == ()
    assert [i.module for i in p.imports] == ["causal_conv1d", "causal_conv1d_cuda"]
    assert not any(i.ok for i in p.imports)
    assert p.imports[0].error == "ModuleNotFoundError: No module named 'causal_conv1d'"
    assert not p.imports_ok


def test_installed_package_facts(plain: EnvReport) -> None:
    p = plain.package("torch")
    assert p.installed and p.version is not None and p.version.startswith("2.13.0")
    assert p.local == "cpu"
    assert p.imports_ok and p.imports[0].file is not None
    assert p.shared_objects and all(s.is_absolute() and s.exists() for s in p.shared_objects)
    assert any(s.name.startswith("libtorch_cpu.so") for s in p.shared_objects)
    assert not p.built_by_us


def causal_conv1d_standin(site: Path) -> None:
    make_dist(site, "causal-conv1d", "1.7.0+cu130torch2.13", {
        "causal_conv1d/__init__.py": "from .causal_conv1d_interface import causal_conv1d_fn, causal_conv1d_update\n",
        "causal_conv1d/causal_conv1d_interface.py": (
            "def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, activation=None):\n    return x\n"
            "def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None):\n    return x\n"),
        "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so": "not an ELF: the stand-in is never loaded as one\n",
    }, requires=("torch==2.13.0", "torchvision; extra == 'x'"), record={"recipe": "causal-conv1d", "cuda": "13.0"})


def test_standin_causal_conv1d_is_what_transformers_binds(tmp_path: Path) -> None:
    """A stand-in causal_conv1d (no GPU build of causal-conv1d can exist here; the real check runs on the GPU
    machine): transformers 5.15+ binds its functions at import, and the probe reports them as kernels."""
    if installed_transformers() < Version("5.15"):
        pytest.skip("transformers < 5.15 binds causal_conv1d only when CUDA is available")
    causal_conv1d_standin(tmp_path)
    report = probe_env(PY, [CAUSAL], env=with_path(tmp_path))
    p = report.package("causal-conv1d")
    assert p.installed and p.version == "1.7.0+cu130torch2.13" and p.local == "cu130torch2.13"
    assert p.requires_torch == ("torch==2.13.0",)
    assert p.shared_objects == (tmp_path / "causal_conv1d_cuda.cpython-311-x86_64-linux-gnu.so",)
    assert p.build_record == {"recipe": "causal-conv1d", "cuda": "13.0"} and p.built_by_us
    assert p.imports[0].ok and p.imports[0].file == tmp_path / "causal_conv1d" / "__init__.py"
    assert not p.imports[1].ok and "ImportError" in (p.imports[1].error or "")  # the fake .so does not load
    for model in report.transformers.models:
        for role in ("causal_conv1d_fn", "causal_conv1d_update"):
            f = model.function(role)
            assert f.kind == "kernel", (model.module, f)
            assert f.module == "causal_conv1d.causal_conv1d_interface" and f.qualname == role
            assert f.package == "causal-conv1d" and f.package_version == "1.7.0+cu130torch2.13"
            assert f.text == (f"kernel (causal-conv1d 1.7.0+cu130torch2.13: causal_conv1d.causal_conv1d_interface."
                              f"{role} from {tmp_path / 'causal_conv1d' / 'causal_conv1d_interface.py'})")
            assert f.fallback_warning is None
        assert model.function("chunk_gated_delta_rule").kind == "torch fallback"
        assert model.fast_path is False


def test_standin_fla_too_gives_the_fast_path(tmp_path: Path) -> None:
    """Stand-ins for both causal_conv1d and fla-core (fla's ops need Triton and a GPU): all four are kernels."""
    if installed_transformers() < Version("5.17"):
        pytest.skip("5.15/5.16 look up fla's ops under names fla does not have; <5.15 needs CUDA")
    causal_conv1d_standin(tmp_path)
    gdr = ("def chunk_gated_delta_rule(q, k, v, g, beta, **kw):\n    return q, None\n"
           "def fused_recurrent_gated_delta_rule(q, k, v, g, beta, **kw):\n    return q, None\n")
    make_dist(tmp_path, "fla-core", "0.6.0", {
        "fla/__init__.py": "", "fla/ops/__init__.py": "", "fla/ops/gated_delta_rule/__init__.py": gdr})
    report = probe_env(PY, [PackageSpec("fla-core", ("fla.ops.gated_delta_rule",))], env=with_path(tmp_path))
    for model in report.transformers.models:
        assert [f.kind for f in model.functions] == ["kernel"] * 4, model.module
        assert model.function("chunk_gated_delta_rule").package == "fla-core"
        assert model.fast_path is True


def test_package_whose_import_fails_and_prints(tmp_path: Path) -> None:
    """An import error (the ABI-mismatch kind) is captured; what the package prints does not spoil the JSON."""
    make_dist(tmp_path, "broken-ext", "1.0", {"broken_ext/__init__.py": (
        "import logging, os, sys, warnings\nprint('noise on stdout')\nos.write(1, b'C-level noise\\n')\n"
        "warnings.warn('NumPy 2 ABI mismatch')\nlogging.getLogger('broken_ext').warning('no GPU found')\n"
        "raise ImportError('/x/broken_ext/_C.so: undefined symbol: _ZN3c104cuda9SetDeviceEa')\n")})
    report = probe_env(PY, [PackageSpec("broken-ext", ("broken_ext",))], env=with_path(tmp_path))
    p = report.package("broken-ext")
    assert p.installed and p.version == "1.0" and not p.imports_ok
    assert p.imports[0].error == "ImportError: /x/broken_ext/_C.so: undefined symbol: _ZN3c104cuda9SetDeviceEa"
    assert p.imports[0].messages == ("broken_ext: no GPU found", "UserWarning: NumPy 2 ABI mismatch")
    with pytest.raises(KeyError):
        report.package("not-asked")


def test_interpreter_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"--python {tmp_path / 'nope'}: no such interpreter") as err:
        probe_env(tmp_path / "nope", [])
    assert err.value.exit_code == 2
    with pytest.raises(UsageError, match="a folder without bin/python"):
        probe_env(tmp_path, [])


def test_venv_folder_is_accepted() -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a venv")
    report = probe_env(Path(sys.prefix), [])
    assert report.python.executable == Path(sys.prefix) / "bin" / "python"


def test_interpreter_that_cannot_run(tmp_path: Path) -> None:
    not_exec = tmp_path / "python"
    not_exec.write_text("#!/bin/sh\nexit 0\n")  # not executable
    with pytest.raises(ToolchainError, match=f"Python {not_exec} cannot run: Permission denied") as err:
        probe_env(not_exec, [])
    assert err.value.exit_code == 7
    failing = tmp_path / "python3"
    failing.write_text("#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(ToolchainError, match=r"failed the environment probe \(exit 1\): Fatal Python error"):
        probe_env(failing, [])
    silent = tmp_path / "python3.99"
    silent.write_text("#!/bin/sh\necho not json\n")
    silent.chmod(0o755)
    with pytest.raises(ToolchainError, match="answer is unreadable"):
        probe_env(silent, [])


def test_computed_tags_match_packaging() -> None:
    """The probe's own tag computation (for envs without packaging) gives packaging's set on this machine."""
    expected = {str(t) for t in ptags.sys_tags()
                if "musllinux" not in t.platform and t.abi != "abi3t"}
    assert set(env_probe.computed_tags()) == expected


# Each older family runs beside the `kernels` its users had: the test venv's own kernels (0.19, which transformers
# 5.25 requires) breaks the hub-kernel table of transformers <= 5.22 (see the next test), so each folder pins one.
OLD_FAMILY_KERNELS = "0.12.3"


def _install_transformers(target: Path, version: str, kernels: str) -> None:
    from builder.core.uvtool import run_uv

    run_uv(["pip", "install", "--quiet", "--target", str(target), "--python", sys.executable,
            f"transformers=={version}", f"kernels=={kernels}"], what=f"installing transformers {version}")


@pytest.mark.network
@pytest.mark.parametrize("version", ["5.10.0", "5.15.0", "5.17.0"])
def test_older_transformers(tmp_path: Path, version: str) -> None:
    """transformers <= 5.14 (plain imports, None when missing), 5.15/5.16 (silent wrappers), 5.17+ (warning
    wrappers): every style is read, all four are the torch fallback here. Installed with uv into a --target folder
    put first on PYTHONPATH (PyPI or uv's cache); the newest family (the lock's transformers) is the unit tests'."""
    target = tmp_path / "site"
    _install_transformers(target, version, OLD_FAMILY_KERNELS)
    report = probe_env(PY, [], env=with_path(target))
    tf = report.transformers
    assert tf.version == version and tf.error is None
    assert {m.module.rsplit(".", 1)[-1] for m in tf.models} == {
        "modeling_qwen3_next", "modeling_qwen3_5", "modeling_qwen3_5_moe"}
    warning = {"5.10.0": "at layer init", "5.15.0": "none (silent)", "5.17.0": "at first call"}[version]
    for model in tf.models:
        assert [f.kind for f in model.functions] == ["torch fallback"] * 4
        assert {f.fallback_warning for f in model.functions} == {warning}
        assert model.is_fast_path_available is (False if version == "5.10.0" else None)


@pytest.mark.network
def test_an_old_transformers_beside_a_new_kernels_is_reported_not_hidden(tmp_path: Path) -> None:
    """transformers 5.10 builds its hub-kernel table at import with LayerRepository(repo_id, layer_name): kernels
    0.19 refuses that (a revision or version is required), so every modeling module fails to import. A user with
    that pair gets neither the installed package nor torch from a Qwen3-Next model; the probe says so per module."""
    target = tmp_path / "site"
    _install_transformers(target, "5.10.0", "0.19.1")
    tf = probe_env(PY, [], env=with_path(target)).transformers
    assert tf.version == "5.10.0" and tf.hub_kernels is not None and tf.hub_kernels.kernels_version == "0.19.1"
    assert tf.models and all(m.error and "revision or a version must be specified" in m.error for m in tf.models)


def test_hub_kernels_are_named_as_someone_elses_beside_the_bound_package(tmp_path: Path) -> None:
    """transformers 5.25 with the kernels it requires: a function is bound to the installed package, and the hub
    kernel a model loaded with use_kernels=True would run instead is named (repository, version or revision,
    devices), as is the whole-layer hub kernel of Qwen3.5's GatedDeltaNet on sm_121; doctor prints both."""
    causal_conv1d_standin(tmp_path)
    tf = probe_env(PY, [CAUSAL], env=with_path(tmp_path)).transformers
    if tf.hub_kernels is None or not tf.hub_kernels.usable:
        pytest.skip(f"skipped: transformers {tf.version} does not accept kernels "
                    f"{tf.hub_kernels.kernels_version if tf.hub_kernels else None}: no hub kernel can be named")
    qwen35 = next(m for m in tf.models if m.short == "qwen3_5")
    conv = qwen35.function("causal_conv1d_fn")
    assert conv.kind == "kernel" and conv.package == "causal-conv1d", conv
    assert conv.hub is not None and conv.hub.layer == "causal_conv1d_fn"
    assert conv.hub.repos[0][0].startswith("kernels-community/") and "cuda" in conv.hub.repos[0][1]
    chunk = qwen35.function("chunk_gated_delta_rule")
    assert chunk.kind == "torch fallback" and chunk.hub is not None and "kernels-community/fla" in chunk.hub.text
    assert qwen35.layer_hub is not None and qwen35.layer_hub.layer == "Qwen3_5GatedDeltaNet"
    assert any("cuda sm_121" in devices for _, devices in qwen35.layer_hub.repos), qwen35.layer_hub
    result = run_cli("doctor", "--python", sys.executable, "--from", str(tmp_path / "none"),
                     env={"PYTHONPATH": str(tmp_path)}, timeout=600)
    assert result.code == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "with use_kernels=True, Hugging Face hub kernels instead (downloaded at load, not built or tested by " \
           "this farm):" in out
    assert f"causal_conv1d_fn, causal_conv1d_update: {conv.hub.text}" in out
    assert f"the whole Qwen3_5GatedDeltaNet layer: {qwen35.layer_hub.text}" in out
