"""Wheel variants (issue 29): fatbin slicing, variant wheels, their names and metadata, and that the uv this
project installs still picks them (schema URL and provider name from model/variants.py)."""

from __future__ import annotations

import json
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest

from builder.core import fatbin
from builder.core.errors import InspectError
from builder.core.uvtool import uv_bin
from builder.core.wheelfile import parse_wheel_name, split_label, write_wheel
from builder.model import variants
from builder.model.arch import Arch
from builder.model.cuda import CudaVersion
from builder.model.records import BuildRecord
from builder.stages.slicing import make_variant


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    """One fatbin entry as nvcc 13 writes it: a 64-byte header (kind, version, header size, padded size, arch at
    byte 28) and the payload."""
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def _container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fatbin.MAGIC, 1, 16, len(body)) + body


def _elf(sections: dict[str, bytes]) -> bytes:
    """A minimal 64-bit little-endian ELF file with these sections (and .shstrtab)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    data, heads = bytearray(64), [bytes(64)]
    for name, body in [*sections.items(), (".shstrtab", names)]:
        offset = len(data)
        data += body
        heads.append(struct.pack("<IIQQQQIIQQ", names.index(name.encode() + b"\0"), 1, 0, 0, offset, len(body),
                                 0, 0, 1, 0))
    shoff = len(data)
    data += b"".join(heads)
    data[:5] = b"\x7fELF\x02"
    data[5] = 1
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHH", data, 0x3A, 64, len(heads), len(heads) - 1)
    return bytes(data)


SM90, SM120 = b"\x90" * 200, b"\x12" * 300
PTX120 = b"ptx-120".ljust(40, b"\0")
TWO_TUS = _container(_entry(2, 120, SM120), _entry(2, 90, SM90), _entry(1, 120, PTX120)) + bytes(8) + \
    _container(_entry(2, 90, SM90[:64]), _entry(2, 120, SM120[:64]))


def test_containers_reads_every_entry_of_every_translation_unit() -> None:
    found = fatbin.containers(TWO_TUS)
    assert [[(e.kind, e.arch) for e in c.entries] for c in found] == [
        [("sass", 120), ("sass", 90), ("ptx", 120)], [("sass", 90), ("sass", 120)]]


def test_keep_only_slices_in_place_and_keeps_the_file_layout() -> None:
    so = _elf({".text": b"\xc3" * 32, fatbin.SECTION: TWO_TUS, ".data": b"after"})
    sliced = fatbin.keep_only(so, fatbin.sass_only(90))
    assert len(sliced) == len(so)
    assert sliced.endswith(so[-200:])  # the section headers and what follows the section did not move
    kept = fatbin.shared_object_code(sliced)
    assert [[(e.kind, e.arch) for e in c.entries] for c in kept] == [[("sass", 90)], [("sass", 90)]]
    offset, size = fatbin.elf_section_span(sliced, fatbin.SECTION) or (0, 0)
    section = sliced[offset:offset + size]
    assert SM90 in section and SM120 not in section and PTX120 not in section
    assert section.count(0) > size // 2  # what was dropped is zeroes (it deflates to nothing in the wheel)


def test_keep_only_refuses_a_container_without_the_arch() -> None:
    so = _elf({fatbin.SECTION: _container(_entry(2, 120, SM120))})
    with pytest.raises(fatbin.FatbinError, match="keeps no entry.*sass 120"):
        fatbin.keep_only(so, fatbin.sass_only(90))


def test_a_broken_section_is_refused_not_rewritten() -> None:
    so = _elf({fatbin.SECTION: b"\x01" * 40})
    with pytest.raises(fatbin.FatbinError, match="no fatbin container at offset 0"):
        fatbin.keep_only(so, fatbin.sass_only(90))


@pytest.mark.parametrize(("name", "plain", "label"), [
    ("x-1.0-cp310-abi3-linux_x86_64-sm120.whl", "x-1.0-cp310-abi3-linux_x86_64.whl", "sm120"),
    ("x-1.0-1-cp310-abi3-linux_x86_64-sm90.whl", "x-1.0-1-cp310-abi3-linux_x86_64.whl", "sm90"),
    ("x-1.0-1-cp310-abi3-linux_x86_64.whl", "x-1.0-1-cp310-abi3-linux_x86_64.whl", None),  # a build tag
    ("x-1.0+cu13-cp310-abi3-linux_x86_64.whl", "x-1.0+cu13-cp310-abi3-linux_x86_64.whl", None),
    ("x-1.0-cp310-abi3-linux_x86_64-SM90.whl", "x-1.0-cp310-abi3-linux_x86_64-SM90.whl", None),  # not a label
])
def test_split_label(name: str, plain: str, label: str | None) -> None:
    assert split_label(name) == (plain, label)


def test_parse_wheel_name_sets_the_label_aside() -> None:
    name, version, _, tags = parse_wheel_name("causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64-sm120.whl")
    assert (name, str(version), {str(t) for t in tags}) == ("causal-conv1d", "1.7.0+cu13", {"cp310-abi3-linux_x86_64"})
    assert variants.variants_file("causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64-sm120.whl") == \
        "causal_conv1d-1.7.0+cu13-variants.json"


def test_variant_metadata_round_trips_and_says_the_arch_and_driver() -> None:
    v = variants.Variant.for_build(Arch(120, ptx=True), CudaVersion.parse("13.0.2"))
    assert (v.label, v.cuda_floor, v.arch) == ("sm120", "13.0", Arch(120))
    table = variants.read_metadata(variants.dumps(variants.metadata([v])), "test")
    assert table == {"sm120": {"nvidia": {"cuda_version_lower_bound": ["13.0"], "sm_arch": ["120_real"]}}}
    assert variants.Variant.from_metadata("sm120", table) == v
    with pytest.raises(ValueError, match="schema"):
        variants.read_metadata(json.dumps({"variants": {}}).encode(), "x")


def _plain_wheel(tmp: Path, so: bytes, name: str = "demo") -> Path:
    info = f"{name}-1.0.dist-info"
    record = BuildRecord(package=name, version="1.0", cuda="13.0", archs=("90", "120"))
    entries = {f"{name}/__init__.py": b"", f"{name}/_C.so": so,
               f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
               f"{info}/cuda_wheel_builder.json": record.wheel_bytes()}
    wheel = tmp / f"{name}-1.0-py3-none-any.whl"
    write_wheel(wheel, entries, info, {})
    return wheel


def test_make_variant_slices_every_object_and_adds_its_metadata(tmp_path: Path) -> None:
    plain = _plain_wheel(tmp_path, _elf({fatbin.SECTION: TWO_TUS}))
    v = variants.Variant.for_build(Arch(90), CudaVersion.parse("13.0"))
    out = make_variant(plain, v, tmp_path / "out")
    assert out.name == "demo-1.0-py3-none-any-sm90.whl"
    with zipfile.ZipFile(out) as zf:
        so = zf.read("demo/_C.so")
        record = json.loads(zf.read("demo-1.0.dist-info/cuda_wheel_builder.json"))
        assert "demo-1.0.dist-info/variant.json" in zf.read("demo-1.0.dist-info/RECORD").decode()
    assert {(e.kind, e.arch) for c in fatbin.shared_object_code(so) for e in c.entries} == {("sass", 90)}
    assert record["archs"] == ["90"] and record["variant"]["label"] == "sm90"
    assert record["variant"]["of_archs"] == ["90", "120"]
    assert variants.of_wheel(out) == v and variants.of_wheel(plain) is None
    with pytest.raises(InspectError, match="no sm_100 code"):
        make_variant(plain, variants.Variant.for_build(Arch(100), CudaVersion.parse("13.0")), tmp_path / "out")
    with pytest.raises(InspectError, match="variant already"):
        make_variant(out, v, tmp_path / "again")


def test_a_wheel_without_gpu_code_has_no_variants(tmp_path: Path) -> None:
    plain = _plain_wheel(tmp_path, b"\x7fELF not really")
    with pytest.raises(InspectError, match="carries no GPU code"):
        make_variant(plain, variants.Variant.for_build(Arch(90), CudaVersion.parse("13.0")), tmp_path / "out")


def test_the_installed_uv_picks_the_variant_for_the_gpu(tmp_path: Path) -> None:
    """The schema URL and provider of model/variants.py, read by this project's uv: sm_120 → sm120, sm_90 → sm90,
    sm_75 or a too-old driver → the plain wheel, and no preview flag → the plain wheel. Fails when uv no longer
    accepts what this builder writes. Offline: --no-index and a folder."""
    links = tmp_path / "links"
    links.mkdir()
    plain = _plain_wheel(links, _elf({fatbin.SECTION: TWO_TUS}))
    made = [variants.Variant.for_build(Arch(a), CudaVersion.parse("13.0")) for a in (90, 120)]
    for v in made:
        make_variant(plain, v, links)
    (links / variants.variants_file(plain.name)).write_bytes(variants.dumps(variants.metadata(made)))
    venv = tmp_path / "venv"
    subprocess.run([uv_bin(), "venv", "-q", str(venv)], check=True)

    def chosen(sm: str | None, driver: str = "13.0", flag: bool = True) -> str:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
        if sm is not None:
            env |= {variants.FORCE_SM_ARCH: sm, variants.FORCE_DRIVER: driver}
        preview = ["--preview-features", variants.UV_PREVIEW_FEATURE] if flag else []
        done = subprocess.run([uv_bin(), "pip", "install", "-q", *preview, "--python", str(venv / "bin" / "python"),
                               "--no-index", "--find-links", str(links), "--reinstall", "demo"],
                              env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        found = list(venv.glob("lib/python*/site-packages/demo-1.0.dist-info/variant.json"))
        return next(iter(json.loads(found[0].read_text())["variants"])) if found else "plain"

    assert chosen("12.0") == "sm120"
    assert chosen("12.1") == "sm120"  # SASS runs on a newer minor of its major
    assert chosen("9.0") == "sm90"
    assert chosen("7.5") == "plain"
    assert chosen("12.0", driver="12.8") == "plain"  # the driver is older than the toolkit's CUDA
    assert chosen("12.0", flag=False) == "plain"


def test_a_variant_is_published_only_beside_its_plain_wheel(tmp_path: Path) -> None:
    """pip and flagless uv skip variant files: a release must never be variants alone. Its variants table appears
    on the project page once a variant with a record saying so is there."""
    from builder.core.errors import PublishError
    from builder.index.store import Wheelhouse
    from builder.model.records import VariantInfo
    from tests.test_index import labelled_wheel

    plain = labelled_wheel(tmp_path / "w", "demo", "1.0", "cu130torch2.14", pins=("torch==2.14.1",))
    variant = plain.with_name(plain.name[:-4] + "-sm90.whl")
    variant.write_bytes(plain.read_bytes())
    house = Wheelhouse(tmp_path / "house")
    v = variants.Variant.for_build(Arch(90), CudaVersion.parse("13.0"))
    record = BuildRecord(package="demo", version="1.0", variant=VariantInfo(v.label, ("90", "120"), v.properties()))
    with pytest.raises(PublishError, match="its plain wheel .* is not there"):
        house.publish(variant, record)
    assert not house.wheels.is_dir() or not list(house.wheels.glob("*.whl"))
    house.publish(plain, BuildRecord(package="demo", version="1.0"))
    house.publish(variant, record)
    table = house.root / "simple" / "demo" / "demo-1.0+cu130torch2.14-variants.json"
    assert variants.read_metadata(table.read_bytes(), "page") == {"sm90": v.properties()}
    page = json.loads((house.root / "simple" / "demo" / "index.json").read_text())
    assert {f["filename"] for f in page["files"]} == {plain.name, variant.name, table.name}
    # with the wheels as release assets: the variants table stays in the pages tree, the variants are assets
    from builder.index.assets import AssetStore
    from builder.index.export import export_assets, export_pages

    house.set_assets(AssetStore("https://example.org/{project}-{version}/"))
    export_assets(house, tmp_path / "assets")
    export_pages(house, tmp_path / "site")
    assert (tmp_path / "site" / "simple" / "demo" / table.name).read_bytes() == table.read_bytes()
    assert not list((tmp_path / "site").rglob("*.whl"))
    assert {p.name for p in (tmp_path / "assets").rglob("*.whl")} == {plain.name, variant.name}
