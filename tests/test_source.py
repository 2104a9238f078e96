"""Source stage: checksums, caching and safe extraction of hostile archives."""

from __future__ import annotations

import io
import subprocess
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from builder.core import archivelimits
from builder.core.errors import ChecksumError, SourceError
from builder.core.fsutil import sha256_file
from builder.core.safetar import safe_extract_tar
from builder.core.safezip import safe_extract_zip
from builder.core.settings import Settings
from builder.stages import source
from builder.stages.resolve import SourceRef, local_version
from builder.stages.source import fetch, unpack


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def file_member(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def link_member(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def test_good_sdist_extracts(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz", [file_member("pkg-1.0/setup.py", b"print()"),
                                                      link_member("pkg-1.0/link", "setup.py", tarfile.SYMTYPE)])
    root = unpack(archive, tmp_path / "out")
    assert root.name == "pkg-1.0" and (root / "setup.py").read_bytes() == b"print()"


@pytest.mark.parametrize(
    ("member", "needle"),
    [
        (file_member("../evil.py"), "climbs out"),
        (file_member("pkg/../../evil.py"), "climbs out"),
        (file_member("/etc/evil.py"), "absolute path"),
        (link_member("pkg/link", "../../etc/passwd", tarfile.SYMTYPE), "points outside"),
        (link_member("pkg/link", "/etc/passwd", tarfile.SYMTYPE), "absolute path"),
        (link_member("pkg/hard", "/etc/passwd", tarfile.LNKTYPE), "absolute path"),
        (link_member("pkg/hard", "../outside", tarfile.LNKTYPE), "points outside"),
        (link_member("pkg/dev", "", tarfile.CHRTYPE), "device"),
        (link_member("pkg/fifo", "", tarfile.FIFOTYPE), "device or fifo"),
    ],
)
def test_hostile_tar_is_refused(tmp_path: Path, member, needle: str) -> None:
    archive = make_tar(tmp_path / "evil.tar.gz", [file_member("pkg/ok.py"), member])
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(SourceError, match=needle):
        safe_extract_tar(archive, dest)
    assert list(dest.iterdir()) == [], "nothing may be extracted from a refused archive"
    assert not (tmp_path / "evil.py").exists()


def test_decompression_bomb_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archivelimits, "MAX_UNPACKED_BYTES", 1024 * 1024)
    archive = make_tar(tmp_path / "bomb.tar.gz", [file_member("pkg/zeros", bytes(4 * 1024 * 1024))])
    assert archive.stat().st_size < 64 * 1024  # tiny on disk, large unpacked
    with pytest.raises(SourceError, match="decompression bomb"):
        safe_extract_tar(archive, tmp_path)


def test_hostile_zip_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("pkg/ok.py", "x")
        zf.writestr("../evil.py", "x")
    with pytest.raises(SourceError, match="climbs out"):
        safe_extract_zip(archive, tmp_path / "out")


def test_not_an_archive(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(SourceError, match="not a readable tar"):
        unpack(bad, tmp_path / "out")


def settings(tmp_path: Path, offline: bool = False) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh", recipes_dir=tmp_path,
                    patches_dir=tmp_path, offline=offline)


def test_local_archive_checksum_mismatch(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz", [file_member("pkg-1.0/setup.py")])
    ok = SourceRef("path", str(archive), archive.name, sha256_file(archive))
    assert fetch(ok, settings(tmp_path))[1] == sha256_file(archive)
    bad = SourceRef("path", str(archive), archive.name, "0" * 64)
    with pytest.raises(ChecksumError, match="checksum mismatch for pkg-1.0.tar.gz"):
        fetch(bad, settings(tmp_path))


def test_url_download_verified_and_cached(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz", [file_member("pkg-1.0/setup.py")])
    digest = sha256_file(archive)
    ref = SourceRef("url", archive.as_uri(), archive.name, digest)
    cached, got = fetch(ref, settings(tmp_path))
    assert got == digest and cached.parent.parent == tmp_path / "cache" / "sources" / "url"
    archive.unlink()  # the cache now serves it, also offline
    assert fetch(ref, settings(tmp_path, offline=True))[1] == digest
    cached.write_bytes(b"tampered")  # a damaged cache entry is not trusted, and offline that is what the error says
    with pytest.raises(ChecksumError, match="checksum mismatch for the cached pkg-1.0.tar.gz"):
        fetch(ref, settings(tmp_path, offline=True))


def test_url_download_with_wrong_hash_leaves_nothing(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "pkg-1.0.tar.gz", [file_member("pkg-1.0/setup.py")])
    ref = SourceRef("url", archive.as_uri(), archive.name, "f" * 64)
    with pytest.raises(ChecksumError):
        fetch(ref, settings(tmp_path))
    assert [p for p in (tmp_path / "cache" / "sources").rglob("*") if p.is_file()] == []


def test_url_sources_are_keyed_by_url_and_content(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 17 case 4: two URLs with the same file name are two sources; with no recorded hash the log says
    "recorded at its first fetch, not verified", and only later fetches are checked (against that hash)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = make_tar(tmp_path / "a" / "pkg-1.0.tar.gz", [file_member("pkg-1.0/setup.py", b"one")])
    two = make_tar(tmp_path / "b" / "pkg-1.0.tar.gz", [file_member("pkg-1.0/setup.py", b"two")])
    path_one, digest_one = fetch(SourceRef("url", one.as_uri(), one.name, None), settings(tmp_path))
    first_log = capsys.readouterr().err
    assert "recorded at its first fetch, not verified" in first_log and "verified" not in first_log.replace(
        "not verified", ""), first_log
    path_two, digest_two = fetch(SourceRef("url", two.as_uri(), two.name, None), settings(tmp_path))
    assert digest_one == sha256_file(one) and digest_two == sha256_file(two) and digest_one != digest_two
    assert path_one != path_two, "the second URL was served the first URL's cached file"
    capsys.readouterr()
    again = fetch(SourceRef("url", one.as_uri(), one.name, None), settings(tmp_path, offline=True))
    assert again[1] == digest_one and "matches the sha256 of its first fetch" in capsys.readouterr().err


def test_url_source_that_changed_since_its_first_fetch_is_refused(tmp_path: Path) -> None:
    (tmp_path / "up").mkdir()
    archive = make_tar(tmp_path / "up" / "pkg-1.0.tar.gz", [file_member("pkg-1.0/setup.py", b"one")])
    ref = SourceRef("url", archive.as_uri(), archive.name, None)
    cached, _ = fetch(ref, settings(tmp_path))
    make_tar(archive, [file_member("pkg-1.0/setup.py", b"changed upstream")])
    cached.unlink()  # the cache is lost: the next fetch is checked against the first one's hash
    with pytest.raises(ChecksumError, match="changed since its first fetch"):
        fetch(ref, settings(tmp_path))
    assert not cached.exists()


def git_repo(repo: Path, tag: str, text: str = "VERSION = '1.0'\n") -> str:
    """A local git repository with one more commit of setup.py, tagged ``tag`` (moved there if it exists);
    returns the commit."""
    repo.mkdir(exist_ok=True)
    (repo / "setup.py").write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    if not (repo / ".git").exists():
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", text], check=True)
    subprocess.run([*git, "tag", "-f", tag], check=True, capture_output=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_git_source(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    git_repo(repo, "v1.0")
    ref = SourceRef("git", repo.as_uri(), "repo", None, "v1.0")
    path, commit = fetch(ref, settings(tmp_path))
    assert len(commit) == 40 and (path / "setup.py").exists()
    assert (unpack(path, tmp_path / "work") / "setup.py").exists()


def test_a_git_source_is_pinned_by_commit_and_a_moved_tag_is_refused(tmp_path: Path) -> None:
    """Issue 26 6(b): the recipe's source.commits pins the tag's commit; checked after the clone, and again on
    the cached clone (also offline). A moved tag is one line naming the tag, the pinned and the found commit."""
    repo = tmp_path / "repo"
    first = git_repo(repo, "v1.0")
    pinned = SourceRef("git", repo.as_uri(), "repo", None, "v1.0", first)
    path, commit = fetch(pinned, settings(tmp_path))
    assert commit == first and (path / "setup.py").read_text() == "VERSION = '1.0'\n"
    assert fetch(pinned, settings(tmp_path, offline=True)) == (path, first)  # the cached clone, checked again
    moved = git_repo(repo, "v1.0", "VERSION = '1.0'  # retagged\n")
    with pytest.raises(ChecksumError) as info:
        fetch(SourceRef("git", repo.as_uri(), "repo", None, "v1.0", "0" * 40), settings(tmp_path))
    assert info.value.message == f"git v1.0 of {repo.as_uri()} is at commit {moved}, the recipe pins {'0' * 40}"
    assert "the tag moved upstream" in (info.value.hint or "")
    assert not [p for p in (tmp_path / "cache" / "git").iterdir() if p.name.startswith(".")], "no clone left behind"
    repinned = SourceRef("git", repo.as_uri(), "repo", None, "v1.0", moved)  # the pin updated: cloned again
    assert fetch(repinned, settings(tmp_path))[1] == moved


def test_the_source_digest_is_named_commit_for_git() -> None:
    assert source.describe_source_digest("git", "a" * 40) == f"commit {'a' * 40}"
    assert source.describe_source_digest("pypi", "b" * 64) == f"sha256 {'b' * 64}"
    assert source.describe_source_digest("path", "c" * 64) == f"sha256 {'c' * 64}"


def test_the_plans_source_row_names_the_git_tag_and_commit() -> None:
    pypi = SourceRef("pypi", "https://x/p-1.0.tar.gz", "p-1.0.tar.gz", "ab" * 32)
    assert pypi.describe() == f"pypi: https://x/p-1.0.tar.gz sha256 {'ab' * 8}…"  # as the plan showed it before
    assert SourceRef("path", "/src/p", "p", None).describe() == "path: /src/p"
    git = SourceRef("git", "https://github.com/o/p", "p", None, "v1.0", "c" * 40)
    assert git.describe() == f"git: https://github.com/o/p at v1.0 (commit {'c' * 40})"
    assert SourceRef("git", "https://github.com/o/p", "p", None, "main").describe() == (
        "git: https://github.com/o/p at main (commit not pinned)")


def test_a_git_recipe_with_one_pinned_version_plans_without_default_version(tmp_path: Path) -> None:
    """Issue 26 6(b): a git recipe pinning one version needs no default-version; the plan carries the tag and the
    pinned commit, and a --source override of the URL carries no pin (the pin is for the recipe's URL)."""
    from builder.model.arch import parse_arch_list
    from builder.model.cuda import CudaVersion
    from builder.model.python import PythonSpec
    from builder.stages.plan import Target, make_plan
    from tests.helpers import LOCAL_TORCH_INDEX

    repo = tmp_path / "repo"
    commit = git_repo(repo, "v1.0")
    folder = tmp_path / "recipes" / "demo"
    folder.mkdir(parents=True)
    (folder / "recipe.toml").write_text(
        f'name = "demo"\nkind = "pure-python"\nversions = ">=1.0"\n[source]\ngit = "{repo.as_uri()}"\n'
        f'[source.commits]\n"1.0" = "{commit}"\n[test]\nimports = ["demo"]\n')
    plan_settings = Settings(cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh",
                             recipes_dir=tmp_path / "recipes", patches_dir=tmp_path / "patches")
    target = Target(package="demo", cuda=CudaVersion.parse("13.0"), archs=parse_arch_list("90"),
                    python=PythonSpec("3.11"), torch="2.14.1", torch_index=str(LOCAL_TORCH_INDEX))
    plan = make_plan(target, plan_settings)
    assert plan.version == "1.0"
    assert plan.source == SourceRef("git", repo.as_uri(), "repo", None, "v1.0", commit)
    assert fetch(plan.source, plan_settings)[1] == commit
    override = make_plan(replace(target, source=f"git+{repo.as_uri()}@v1.0"), plan_settings)
    assert override.source.commit is None


@pytest.mark.parametrize("fmt", ["gnu long name", "pax header"])
def test_oversized_tar_headers_are_refused_before_tarfile_reads_them(tmp_path: Path, fmt: str) -> None:
    """Issue 17 case 5: tarfile reads a GNU long-name or pax header whole, before any size check; the pre-scan
    reads only the header's size field. 2 MiB here (the limit is 1 MiB); the issue's 1 GiB one is refused the same
    way, in the same few milliseconds, since its data is never read."""
    import time

    archive = tmp_path / "bomb.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.GNU_FORMAT if fmt == "gnu long name" else tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("pkg/" + "a" * (2 << 20) if fmt == "gnu long name" else "pkg/x")
        if fmt == "pax header":
            info.pax_headers = {"comment": "x" * (2 << 20)}
        tar.addfile(info, io.BytesIO(b""))
    dest = tmp_path / "out"
    dest.mkdir()
    start = time.monotonic()
    with pytest.raises(SourceError, match=("GNU long-name" if fmt == "gnu long name" else "pax") + r" header of \d+ bytes"):
        safe_extract_tar(archive, dest)
    assert time.monotonic() - start < 5
    assert list(dest.iterdir()) == []


def test_a_huge_claimed_header_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A raw GNU long-name header claiming 1 GiB (the data is not even there): refused from the size field."""
    header = bytearray(512)
    header[0:13] = b"././@LongLink"
    header[100:108] = b"0000644\0"
    header[124:136] = b"%011o\0" % (1 << 30)
    header[156:157] = b"L"
    header[257:263] = b"ustar "
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    archive = tmp_path / "claim.tar"
    archive.write_bytes(bytes(header) + bytes(4096))
    with pytest.raises(SourceError, match="GNU long-name header of 1073741824 bytes"):
        safe_extract_tar(archive, tmp_path / "out")


@pytest.mark.parametrize("name", [".", "", "./"])
def test_odd_member_names_are_refused(tmp_path: Path, name: str) -> None:
    archive = make_tar(tmp_path / "odd.tar.gz", [file_member("pkg/ok.py"), file_member(name)])
    assert_refused_writing_nothing(archive, tmp_path / "out", "empty name|names the top folder")


def test_a_top_folder_entry_is_fine(tmp_path: Path) -> None:
    """``tar -C dir .`` writes a ``./`` directory entry first: that is a normal archive."""
    top = tarfile.TarInfo("./")
    top.type = tarfile.DIRTYPE
    archive = make_tar(tmp_path / "ok.tar.gz", [(top, None), file_member("./pkg-1.0/setup.py", b"print()")])
    assert (unpack(archive, tmp_path / "out") / "setup.py").is_file()


@pytest.mark.parametrize("members", [
    [("pkg/l1", ".."), ("pkg/l2", "l1/..")],           # issue 17 case 10: each link alone stays inside
    [("pkg/l1", "l2"), ("pkg/l2", "l1")],              # a loop
    [("a/b/l1", "../.."), ("a/b/l2", "l1/../x")],
])
def test_symlink_chains_leaving_the_tree_are_refused_before_writing(tmp_path: Path, members) -> None:
    archive = make_tar(tmp_path / "chain.tar.gz", [file_member("pkg/ok.py")] +
                       [link_member(name, target, tarfile.SYMTYPE) for name, target in members])
    assert_refused_writing_nothing(archive, tmp_path / "out", "through another link")


def assert_refused_writing_nothing(archive: Path, dest: Path, match: str) -> None:
    dest.mkdir()
    with pytest.raises(SourceError, match=match):
        safe_extract_tar(archive, dest)
    assert list(dest.iterdir()) == [], "nothing is written from a refused archive"


def test_an_sdist_file_names_its_version(tmp_path: Path) -> None:
    """`builder build X --source X-1.7.0.tar.gz --offline` needs no --version (found on the GPU machine, issue 39)."""
    for name, version in (("causal_conv1d-1.7.0.tar.gz", "1.7.0"), ("mamba_ssm-2.3.2.post1.tar.gz", "2.3.2.post1")):
        (tmp_path / name).write_bytes(b"")
        assert local_version(tmp_path / name) == version
    (tmp_path / "source.tar.gz").write_bytes(b"")
    assert local_version(tmp_path / "source.tar.gz") is None
