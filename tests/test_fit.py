"""Which wheels fit an environment, read from a real wheelhouse (pages, sidecars, records) over file:// and HTTP."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from builder.core.errors import SourceError
from builder.index.store import Wheelhouse
from builder.model.arch import runs_on
from builder.model.cuda import CudaVersion
from builder.model.records import BuildRecord
from builder.user.fit import EnvFacts, best, env_label, judge, label_cuda
from builder.user.wheelhouse import WheelhouseReader
from tests.helpers import ROOT
from tests.test_index import labelled_wheel

TAGS = frozenset({"cp312-cp312-linux_x86_64", "py3-none-any", "cp312-none-any"})
ENV_128 = EnvFacts(python="3.12.1", tags=TAGS, torch="2.10.0", torch_cuda="12.8", gpus=(120,))
ENV_130 = EnvFacts(python="3.12.1", tags=TAGS, torch="2.14.1", torch_cuda="13.0", gpus=(120,))


def _record(sass: list[str], ptx: list[str] = ()) -> dict:  # what a real build's wheelhouse record holds
    return {"inspect": {"objects": [{"path": "x.so", "sass": sass, "ptx": list(ptx), "needed": []}]},
            "tests": {"import_status": "passed", "kernel_status": "skipped"}}


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory) -> Wheelhouse:
    tmp = tmp_path_factory.mktemp("fit")
    house = Wheelhouse(tmp / "wh")
    for label, pin in (("cu128torch2.10", "torch==2.10.0"), ("cu130torch2.14", "torch==2.14.1")):
        house.publish(labelled_wheel(tmp, "pure", "0.6.0", label, pins=(pin,)), BuildRecord.from_json({}))
    house.publish(labelled_wheel(tmp, "ext", "1.7.0", "cu130torch2.14", pins=("torch==2.14.1",),
                                 tag="cp312-cp312-linux_x86_64"), BuildRecord.from_json(_record(["sm_120"])))
    house.publish(labelled_wheel(tmp, "ext", "1.6.0", "cu130torch2.14", pins=("torch==2.14.1",),
                                 tag="cp312-cp312-linux_x86_64"), BuildRecord.from_json(_record(["sm_90"])))
    house.publish(labelled_wheel(tmp, "ext", "1.7.0", "cu130torch2.14", pins=("torch==2.14.1",),
                                 tag="cp311-cp311-linux_x86_64"), BuildRecord.from_json(_record(["sm_120"])))
    return house


def test_labels_and_arch_rules() -> None:
    assert label_cuda("cu128torch2.10") == CudaVersion.parse("12.8")
    assert label_cuda("cu132torch2.15") == CudaVersion.parse("13.2")
    assert label_cuda("local") is None and label_cuda(None) is None
    assert env_label("2.10.0+cu128", "12.8") == "cu128torch2.10"
    assert runs_on(("sm_120",), (), 121)  # same major, newer minor
    assert not runs_on(("sm_120",), (), 90) and not runs_on(("sm_90",), (), 120)  # SASS is not forward-compatible
    assert runs_on(("sm_90",), ("compute_90",), 120)  # PTX is
    assert runs_on(("sm_90a",), (), 90) and not runs_on(("sm_90a",), (), 91)


def test_each_env_gets_its_own_torch_and_cuda(house: Wheelhouse) -> None:
    reader = WheelhouseReader(house.root)
    old = [judge(w, ENV_128) for w in reader.wheels("pure")]
    chosen = best(old)
    assert chosen is not None and chosen.wheel.label == "cu128torch2.10"
    refused = next(v for v in old if not v.fits)
    assert "pins torch==2.14.1, the env has torch 2.10.0" in refused.reasons
    assert "a CUDA 13.0 build; the env's torch is CUDA 12.8" in refused.reasons
    new = best([judge(w, ENV_130) for w in reader.wheels("pure")])
    assert new is not None and new.wheel.label == "cu130torch2.14"


def test_gpu_code_python_tag_and_version_order(house: Wheelhouse) -> None:
    reader = WheelhouseReader(house.root)
    verdicts = [judge(w, ENV_130) for w in reader.wheels("ext")]
    chosen = best(verdicts)
    assert chosen is not None and chosen.wheel.filename.startswith("ext-1.7.0+cu130torch2.14-cp312")
    assert chosen.wheel.sass == ("sm_120",)
    cp311 = next(v for v in verdicts if "cp311" in v.wheel.filename)
    assert any("not Python 3.12.1" in r for r in cp311.reasons)
    on_hopper = EnvFacts(python="3.12.1", tags=TAGS, torch="2.14.1", torch_cuda="13.0", gpus=(90,))
    hopper = best([judge(w, on_hopper) for w in reader.wheels("ext")])
    assert hopper is not None and hopper.wheel.version.public == "1.6.0"  # the only one with sm_90 code
    cpu_torch = EnvFacts(python="3.12.1", tags=TAGS, torch="2.14.1", torch_cuda=None)
    assert all("the env's torch is a CPU build" in " ".join(judge(w, cpu_torch).reasons) for w in reader.wheels("ext"))
    assert reader.wheels("no-such-project") == []


def test_served_over_http_reads_the_same(house: Wheelhouse) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "builder", "serve", "--wheelhouse", str(house.root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                            env={**os.environ, "COLUMNS": "300"})
    try:
        line = proc.stdout.readline()
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        served = {w.filename: w for w in WheelhouseReader(url).wheels("ext")}
        local = {w.filename: w for w in WheelhouseReader(house.root).wheels("ext")}
        assert served.keys() == local.keys()
        assert all(served[k].sass == local[k].sass and served[k].requires == local[k].requires for k in local)
        assert WheelhouseReader(url).channel_url("cu128torch2.10") == f"{url.rstrip('/')}/channels/cu128torch2.10/simple/"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_unreadable_wheelhouse_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(SourceError, match="has no index pages"):
        WheelhouseReader(tmp_path / "empty").check()
    with pytest.raises(SourceError, match="refused the connection"):
        WheelhouseReader("http://127.0.0.1:9/", timeout_s=2).check()
