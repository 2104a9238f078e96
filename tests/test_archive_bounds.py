"""Issue 30: bounds that hold for the whole archive (header bytes, pax records, member count, unpacked size, link
steps), checked while it is read; one line, not a traceback, for names the file system cannot take; and
`builder test` on a file that is not a wheel."""

from __future__ import annotations

import gzip
import io
import tarfile
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from builder.core import archivelimits
from builder.core.errors import InspectError, SourceError
from builder.core.safetar import safe_extract_tar
from builder.core.safezip import safe_extract_zip
from builder.core.wheelfile import check_wheel_file
from builder.stages.source import unpack
from tests.helpers import assert_one_line_error, run_cli


def raw_header(name: bytes, size: int, kind: bytes = b"0", *, size_field: bytes | None = None) -> bytes:
    """One ustar header block, crafted (tarfile would not write most of what these tests need)."""
    block = bytearray(512)
    block[0:len(name)] = name
    block[100:108] = b"0000644\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = size_field or b"%011o\0" % size
    block[136:148] = b"00000000000\0"
    block[156:157] = kind
    block[257:265] = b"ustar\x0000"
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def raw_entry(name: bytes, data: bytes = b"", kind: bytes = b"0") -> bytes:
    return raw_header(name, len(data), kind) + data + bytes(-len(data) % 512)


def pax_entry(records: bytes, kind: bytes = b"x") -> bytes:
    return raw_entry(b"././@PaxHeader", records, kind)


def write_tar(path: Path, *blocks: bytes, end: bytes = bytes(1024)) -> Path:
    with gzip.open(path, "wb", compresslevel=1) as f:
        for block in blocks:
            f.write(block)
        f.write(end)
    return path


def refused(archive: Path, needle: str, tmp_path: Path, *, seconds: float = 5) -> None:
    """Refused with a SourceError naming ``needle``, within ``seconds``, and nothing written."""
    dest = tmp_path / "out"
    dest.mkdir(exist_ok=True)
    start = time.monotonic()
    with pytest.raises(SourceError, match=needle) as info:
        (safe_extract_zip if archive.suffix == ".zip" else safe_extract_tar)(archive, dest)
    assert time.monotonic() - start < seconds
    assert "\n" not in info.value.one_line() and len(info.value.one_line()) < 400
    assert list(dest.iterdir()) == [], "nothing is written from a refused archive"


# ---------------------------------------------------------------- whole-archive bounds


def test_pax_headers_are_bounded_in_all_at_the_real_limit(tmp_path: Path) -> None:
    """Issue 30: 3000 pax headers of 1 MiB each took 178 s at 3.0 GB. 17 headers just under the 1 MiB per-header
    limit pass it one by one; their 16 MiB sum is refused at the 17th, with the real limits."""
    comment = b"x" * (archivelimits.MAX_HEADER_BYTES - 64)
    record = b"%d comment=%s\n" % (len(comment) + 18, comment)
    record = b"%d comment=%s\n" % (len(record), comment)
    blocks = [pax_entry(record) + raw_entry(b"pkg/f%02d" % i, b"x") for i in range(17)]
    refused(write_tar(tmp_path / "many-pax.tar.gz", *blocks), "pax and GNU long-name headers hold more than 16 MiB",
            tmp_path)


def test_many_long_names_are_refused_in_bounded_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GNU long-name shape of issue 30 (3000 of them: 3.0 GB, 600 s), scaled down: 200 names of 1200 bytes
    against a 64 KiB total. tarfile holds every name it has read; the bound keeps that small."""
    monkeypatch.setattr(archivelimits, "MAX_HEADER_TOTAL", 64 * 1024)
    archive = tmp_path / "many-longname.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for i in range(200):
            info = tarfile.TarInfo(f"pkg/{i:03d}/" + "/".join(["n" * 200] * 6))
            tar.addfile(info, io.BytesIO(b""))
    tracemalloc.start()
    try:
        refused(archive, "more than 0 MiB in all", tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024**2, f"peak {peak} bytes while refusing"


def test_the_member_count_stops_the_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The count is checked as tarfile yields each member: what follows the limit (here a header tarfile would
    read whole) is never reached."""
    monkeypatch.setattr(archivelimits, "MAX_MEMBERS", 50)
    blocks = [raw_entry(b"pkg/f%03d" % i, b"x") for i in range(51)]
    blocks.append(raw_entry(b"././@LongLink", b"n" * 4 * 1024**2, b"L"))  # 4 MiB: refused differently if read
    refused(write_tar(tmp_path / "many.tar.gz", *blocks), "more than 50 members", tmp_path)


def test_the_unpacked_size_is_summed_over_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archivelimits, "MAX_UNPACKED_BYTES", 100 * 1024)
    blocks = [raw_entry(b"pkg/f%02d" % i, bytes(30 * 1024)) for i in range(4)]  # each fine, 120 KiB in all
    refused(write_tar(tmp_path / "sum.tar.gz", *blocks), "unpacks to more than 0 MiB", tmp_path)


def test_a_pax_header_crafted_for_tarfiles_quadratic_parse_is_refused(tmp_path: Path) -> None:
    """tarfile 3.11.7 rescans to the next '=' for each record: this 1.3 KB archive (256 KiB of records) drove
    RSS to 8.5 GB in 60 s before. Refused from its malformed records, in milliseconds."""
    archive = write_tar(tmp_path / "redos.tar.gz", pax_entry(b"2 " * (128 * 1024) + b"=\n"), raw_entry(b"pkg/f"))
    refused(archive, "malformed pax header", tmp_path)


def test_a_long_run_of_digits_in_a_pax_header_is_refused(tmp_path: Path) -> None:
    """tarfile <= 3.11.9 searches for 'hdrcharset' from every digit: 64 KiB of digits cost 8 s, 1 MiB hours."""
    value = b"9" * 10_000
    record = b"%d comment=%s\n" % (len(value) + 15, value)
    archive = write_tar(tmp_path / "digits.tar.gz", pax_entry(record), raw_entry(b"pkg/f"))
    refused(archive, "a run of 10000 digits", tmp_path)


def test_a_chain_of_pax_headers_is_refused_before_tarfile_recurses(tmp_path: Path) -> None:
    """Each extended header makes tarfile recurse once: 2000 in a row was a RecursionError traceback."""
    archive = write_tar(tmp_path / "chain.tar.gz", *[pax_entry(b"11 a=bcdef\n")] * 2000, raw_entry(b"pkg/f"))
    refused(archive, "more than 16 pax or GNU long-name headers in a row", tmp_path)


def test_global_pax_records_are_bounded(tmp_path: Path) -> None:
    """tarfile applies and copies every global record to each member: 60 000 of them before 20 000 members
    took 4.6 GB and over 60 s."""
    records = b"".join(b"11 k%03d=ab\n" % i for i in range(100))
    archive = write_tar(tmp_path / "global.tar.gz", pax_entry(records, b"g"), raw_entry(b"pkg/f"))
    refused(archive, "more than 64 global pax records", tmp_path)


def test_too_many_records_in_one_pax_header(tmp_path: Path) -> None:
    records = b"".join(b"12 k%04d=ab\n" % i for i in range(1001))
    archive = write_tar(tmp_path / "records.tar.gz", pax_entry(records), raw_entry(b"pkg/f"))
    refused(archive, "more than 1000 records", tmp_path)


@pytest.mark.parametrize(("blocks", "needle"), [
    ([pax_entry(b"24 GNU.sparse.size=abcd\n"), raw_entry(b"pkg/f")], "GNU sparse"),  # was a ValueError traceback
    ([raw_entry(b"pkg/sparse", b"", b"S")], "GNU sparse"),
    ([raw_header(b"pkg/f", 0, size_field=b"\xff" * 12)], "negative size"),  # base-256 -1: tarfile seeks back
    ([raw_entry(b"pkg/h", b"", b"1")], "names no file before it"),  # a hard link to nothing: tarfile searches
    ([pax_entry(b"6 a=b\n" + b"7" * 30), raw_entry(b"pkg/f")], "malformed pax header"),  # no space after a length
    ([pax_entry(b"5 a=b\n"), raw_entry(b"pkg/f")], "malformed pax header"),  # a length that ends mid-record
])
def test_headers_tarfile_mishandles_are_refused(tmp_path: Path, blocks: list[bytes], needle: str) -> None:
    refused(write_tar(tmp_path / "odd.tar.gz", raw_entry(b"pkg/ok", b"x"), *blocks), needle, tmp_path)


def test_a_damaged_header_is_not_taken_for_the_end(tmp_path: Path) -> None:
    """tarfile ends the listing quietly at a header with a bad checksum; the members after it were lost."""
    bad = bytearray(raw_entry(b"pkg/b", b"y"))
    bad[148:156] = b"0000000\0"
    archive = write_tar(tmp_path / "damaged.tar.gz", raw_entry(b"pkg/a", b"x"), bytes(bad), raw_entry(b"pkg/c"))
    refused(archive, "damaged at byte 1024", tmp_path)


def test_a_truncated_gzip_stream_is_one_line(tmp_path: Path) -> None:
    whole = write_tar(tmp_path / "whole.tar.gz", *[raw_entry(b"pkg/f%03d" % i, bytes(range(256)) * 8)
                                                    for i in range(50)]).read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    refused(cut, "not a readable tar archive", tmp_path)


def test_symlink_steps_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archivelimits, "MAX_LINK_STEPS", 1000)
    links = []
    for i in range(20):
        info = tarfile.TarInfo(f"pkg/l{i:02d}")
        info.type = tarfile.SYMTYPE
        info.linkname = "d/" * 30 + "../" * 30 + (f"l{i + 1:02d}" if i < 19 else "d")
        links.append(info)
    archive = tmp_path / "links.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        folder = tarfile.TarInfo("pkg/d")
        folder.type = tarfile.DIRTYPE
        for info in [folder, *links]:
            tar.addfile(info)
        tar.addfile(tarfile.TarInfo("pkg/l00/f"), io.BytesIO(b""))
    refused(archive, "symlinks take more than 1000 steps", tmp_path)


def test_a_normal_archive_with_links_and_long_names_still_extracts(tmp_path: Path) -> None:
    long_name = "pkg-1.0/" + "/".join(["d" * 100] * 3) + "/f.py"
    archive = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, data in [("pkg-1.0/setup.py", b"print()"), (long_name, b"x")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        hard = tarfile.TarInfo("pkg-1.0/setup-copy.py")
        hard.type, hard.linkname = tarfile.LNKTYPE, "pkg-1.0/setup.py"
        soft = tarfile.TarInfo("pkg-1.0/link")
        soft.type, soft.linkname = tarfile.SYMTYPE, "setup.py"
        tar.addfile(hard)
        tar.addfile(soft)
    root = unpack(archive, tmp_path / "work")
    assert (root / "setup-copy.py").read_bytes() == (root / "link").read_bytes() == b"print()"
    assert (tmp_path / "work" / long_name).read_bytes() == b"x"


# ---------------------------------------------------------------- names the file system cannot take


def tar_of(path: Path, *names: str, dirs: tuple[str, ...] = ()) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return path


def zip_of(path: Path, *names: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name in names:
            zf.writestr(name, "x")
    return path


@pytest.mark.parametrize("make", [tar_of, zip_of], ids=["tar", "zip"])
@pytest.mark.parametrize(("names", "needle"), [
    (["pkg/a", "pkg/a/b"], "'pkg/a' is a file, yet the archive also puts 'pkg/a/b' under it"),  # was a traceback
    (["pkg/a/b", "pkg/a"], "'pkg/a' is a file, yet"),
    (["pkg/" + "a/" * 5000 + "f"], "longer than 2048 bytes"),  # was a RecursionError traceback
    (["pkg/" + "a/" * 300 + "f"], "302 folders deep"),
    (["pkg/" + "c" * 300], "a file name of 300 bytes"),  # was an OSError traceback
])
def test_names_the_file_system_cannot_take_are_one_line(tmp_path: Path, make, names: list[str], needle: str) -> None:
    archive = make(tmp_path / ("odd.tar.gz" if make is tar_of else "odd.zip"), *names)
    refused(archive, needle, tmp_path)


def test_a_file_and_a_folder_of_the_same_name(tmp_path: Path) -> None:
    refused(tar_of(tmp_path / "same.tar.gz", "pkg/a", dirs=("pkg/a",)), "'pkg/a' is both a file and a folder",
            tmp_path)
    refused(zip_of(tmp_path / "same.zip", "pkg/a", "pkg/a/"), "'pkg/a' is both a file and a folder", tmp_path)


def test_a_zip_member_with_an_empty_name(tmp_path: Path) -> None:
    """ZipInfo.is_dir() raised IndexError on it (a traceback). The zip is written by hand: zipfile would not."""
    import struct
    import zlib

    crc = zlib.crc32(b"y")
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0x21, crc, 1, 1, 0, 0) + b"y"
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, crc, 1, 1, 0, 0, 0, 0, 0,
                          0o100644 << 16, 0)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central), len(local), 0)
    archive = tmp_path / "empty-name.zip"
    archive.write_bytes(local + central + end)
    refused(archive, "a member has an empty name", tmp_path)


def test_a_zip_central_directory_is_counted_before_zipfile_reads_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archivelimits, "MAX_MEMBERS", 10)
    archive = zip_of(tmp_path / "many.zip", *[f"pkg/f{i}" for i in range(11)])
    monkeypatch.setattr(zipfile, "ZipFile", None)  # never reached
    refused(archive, "more than 10 members", tmp_path)


def test_zip_names_are_bounded_in_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archivelimits, "MAX_HEADER_TOTAL", 4096)
    archive = zip_of(tmp_path / "names.zip", *[f"pkg/{i:02d}/" + "n" * 200 for i in range(30)])
    refused(archive, "names and extra fields hold more than 0 MiB", tmp_path)


def test_a_zip_with_a_comment_and_a_good_tree_still_extracts(tmp_path: Path) -> None:
    archive = zip_of(tmp_path / "pkg-1.0.zip", "pkg-1.0/setup.py", "pkg-1.0/src/a.py")
    with zipfile.ZipFile(archive, "a") as zf:
        zf.comment = b"a comment after the central directory " + b"c" * 1000
    assert (unpack(archive, tmp_path / "work") / "src" / "a.py").read_text() == "x"


# ---------------------------------------------------------------- `builder test` on a file that is not a wheel


def make_files(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "real-1.0-py3-none-any.whl"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("real/__init__.py", "x" * 5000)
        zf.writestr("real-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    files = {"good": good, "name": tmp_path / "junk.whl", "zip": tmp_path / "demo.zip",
             "renamed zip": tmp_path / "demo-1.0-py3-none-any.whl", "truncated": tmp_path / "demo-2.0-py3-none-any.whl"}
    files["name"].write_bytes(good.read_bytes())
    zip_of(files["zip"], "demo/__init__.py")
    zip_of(files["renamed zip"], "demo/__init__.py")
    files["truncated"].write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    return files


@pytest.mark.parametrize(("case", "needle"), [
    ("name", "not a wheel: Invalid wheel filename"),
    ("zip", "not a wheel: Invalid wheel filename (extension must be '.whl')"),
    ("renamed zip", "not a wheel: a zip without a .dist-info/WHEEL file"),
    ("truncated", "not a wheel: not a readable zip"),
])
def test_check_wheel_file(tmp_path: Path, case: str, needle: str) -> None:
    files = make_files(tmp_path)
    check_wheel_file(files["good"])
    with pytest.raises(InspectError, match="^" + str(files[case]).replace(".", r"\.") + ": ") as info:
        check_wheel_file(files[case])
    assert needle in info.value.message


def test_builder_test_on_a_file_that_is_not_a_wheel(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """Issue 30: a non-wheel name was an InvalidWheelFilename traceback; a zip or a truncated wheel said "no recipe
    for package …". Each is one line naming the file, before any recipe is looked up."""
    files = make_files(tmp_path)
    for case in ("name", "zip", "truncated"):
        result = run_cli("test", str(files[case]), "--no-promote", env=cli_env)
        assert_one_line_error(result, f"{files[case]}: not a wheel")
        assert result.code == InspectError.exit_code
