"""A test "SGLang install": a venv whose sglang dist-info names a release and whose `sglang`
console script is the STAND-IN server tests/engines/sglang/standin_sglang.py (SGLang has no CPU
build), with the release's real flashinfer_autotune.py (its key code) installed beside. fi-cache
reads the release and FlashInfer's version from that venv's packages, as it would from a real
SGLang venv; the venv sees fi-cache's test venv (torch) and one real FlashInfer
through a .pth file."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "engines" / "sglang" / "standin_sglang.py"


def sglang_venv(where: Path, version: str, flashinfer: Path | None) -> Path:
    """A venv at `where` with "sglang `version`" (and the FlashInfer in dir `flashinfer`);
    returns its `sglang` script."""
    if not (where / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = where / "lib" / py / "site-packages"
    ours = sysconfig.get_paths()["purelib"]  # torch and fi-cache's dependencies
    lines = [*([str(flashinfer)] if flashinfer else []), ours, str(ROOT)]
    (site / "fi_cache_test_standin.pth").write_text("".join(f"{line}\n" for line in lines))
    dist = site / f"sglang-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    # The release's own key module where an install has it: fi-cache's seeding reads it there.
    from tests.sglang_layout import MODULE, NoWheel, sglang_module

    try:
        (site / MODULE).parent.mkdir(parents=True, exist_ok=True)
        (site / MODULE).write_text(sglang_module(version))
    except NoWheel:
        pass  # a release without its wheel here: no key code, so fi-cache does not seed
    script = where / "bin" / "sglang"
    script.write_text(
        f"#!{where / 'bin' / 'python'}\n"
        "import runpy, sys\n"
        f"sys.argv[0] = {str(STANDIN)!r}\n"
        f"runpy.run_path({str(STANDIN)!r}, run_name='__main__')\n"
    )
    script.chmod(0o755)
    return script
