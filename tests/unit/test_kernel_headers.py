from pathlib import Path

from lens_ebpf.agent.kernel_headers import resolve


def make_tree(root: Path, name: str, kconfig: bool) -> Path:
    tree = root / "usr/src" / name
    (tree / "include" / "linux").mkdir(parents=True)
    if kconfig:
        (tree / "include" / "linux" / "kconfig.h").write_text("")
    return tree


def test_modules_build_tree_wins(tmp_path: Path) -> None:
    tree = make_tree(tmp_path, "linux-headers-6.9.0-1-amd64", kconfig=True)
    mod = tmp_path / "lib/modules/6.9.0"
    mod.mkdir(parents=True)
    (mod / "build").symlink_to(tree)
    got = resolve("6.9.0", tmp_path / "lib/modules", tmp_path / "none", str(tmp_path / "x*"))
    assert got.source == "modules" and got.path == str(tree)


def test_kheaders_before_fallback(tmp_path: Path) -> None:
    kh = tmp_path / "kheaders.tar.xz"
    kh.write_bytes(b"")
    make_tree(tmp_path, "linux-headers-6.1.0-9-amd64", kconfig=False)
    got = resolve(
        "6.18.0", tmp_path / "lib/modules", kh, str(tmp_path / "usr/src/linux-headers-*-amd64")
    )
    assert got.source == "kheaders"


def test_fallback_links_build_and_common_source(tmp_path: Path) -> None:
    build = make_tree(tmp_path, "linux-headers-6.1.0-9-amd64", kconfig=False)
    common = make_tree(tmp_path, "linux-headers-6.1.0-9-common", kconfig=True)
    mods = tmp_path / "lib/modules"
    pattern = str(tmp_path / "usr/src/linux-headers-*-amd64")
    dry = resolve("6.18.0", mods, tmp_path / "none", pattern, link=False)
    assert dry.source == "fallback" and not (mods / "6.18.0").exists()
    got = resolve("6.18.0", mods, tmp_path / "none", pattern, link=True)
    assert got.source == "fallback" and got.path == str(build)
    assert (mods / "6.18.0/build").resolve() == build
    assert (mods / "6.18.0/source").resolve() == common
    # once linked, the next start finds it as a modules tree
    assert resolve("6.18.0", mods, tmp_path / "none", pattern).source == "modules"


def test_nothing_found_says_what_to_install(tmp_path: Path) -> None:
    got = resolve("6.18.0", tmp_path / "lib/modules", tmp_path / "none", str(tmp_path / "no*"))
    assert not got.found
    assert "linux-headers-amd64" in got.detail


def test_host_tree_under_a_host_root_is_linked_first(tmp_path: Path) -> None:
    host = tmp_path / "host"
    tree = make_tree(host, "linux-headers-6.8.0-45-generic", kconfig=True)
    mod = host / "lib/modules/6.8.0-45-generic"
    mod.mkdir(parents=True)
    (mod / "build").symlink_to("/usr/src/linux-headers-6.8.0-45-generic")  # a host path
    fallback = make_tree(tmp_path, "linux-headers-6.1.0-9-amd64", kconfig=True)
    mods = tmp_path / "lib/modules"
    got = resolve(
        "6.8.0-45-generic", mods, tmp_path / "none", str(fallback), link=True, host_root=host
    )
    assert got.source == "host" and got.path == str(tree)
    assert (mods / "6.8.0-45-generic/build").resolve() == tree
    # a host without headers falls back to the image's tree
    got = resolve("6.9.9", mods, tmp_path / "none", str(fallback), link=True, host_root=host)
    assert got.source == "fallback"
