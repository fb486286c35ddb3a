"""``seer_runtime.harness.install_lmms_eval``: a wheel's requirements that the environment does not
satisfy leave its metadata (code and every other file byte for byte the same, RECORD rehashed), so
``pip check`` stays clean after lmms-eval is installed beside the CPU torch."""

from __future__ import annotations

import base64
import hashlib
import zipfile

from seer_runtime.harness.install_lmms_eval import satisfied, trim_wheel, trimmed_metadata

METADATA = """Metadata-Version: 2.4
Name: demo-pkg
Version: 1.0
Summary: A demo
Requires-Dist: torch>=2.1.0
Requires-Dist: torchvision>=0.16.0
Requires-Dist: numpy<1
Requires-Dist: fastapi; extra == "server"
Provides-Extra: server

The description.
"""


def test_requirements_the_environment_does_not_satisfy_are_dropped():
    assert satisfied("torch>=2.1.0") and not satisfied("torch<1") and satisfied('fastapi; extra == "server"')
    assert not satisfied("surely-not-an-installed-package-name")
    text, dropped = trimmed_metadata(METADATA)
    assert dropped == ["torchvision>=0.16.0", "numpy<1"] or dropped == ["numpy<1"]  # torchvision may be installed
    assert "Requires-Dist: torch>=2.1.0" in text and 'Requires-Dist: fastapi; extra == "server"' in text
    assert "Requires-Dist: numpy<1" not in text and text.endswith("The description.\n")
    assert f"Summary: A demo [installed by seer without: {', '.join(dropped)}]" in text


def test_the_wheel_keeps_its_files_and_a_valid_record(tmp_path):
    wheel, out = tmp_path / "demo_pkg-1.0-py3-none-any.whl", tmp_path / "out.whl"
    code = b"VALUE = 1\n"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo_pkg/__init__.py", code)
        z.writestr("demo_pkg-1.0.dist-info/METADATA", METADATA)
        z.writestr("demo_pkg-1.0.dist-info/RECORD", "demo_pkg/__init__.py,sha256=x,10\n"
                                                    "demo_pkg-1.0.dist-info/METADATA,sha256=old,1\n"
                                                    "demo_pkg-1.0.dist-info/RECORD,,\n")
    dropped = trim_wheel(wheel, out)
    assert "numpy<1" in dropped
    with zipfile.ZipFile(out) as z:
        assert z.read("demo_pkg/__init__.py") == code
        metadata = z.read("demo_pkg-1.0.dist-info/METADATA")
        record = z.read("demo_pkg-1.0.dist-info/RECORD").decode().splitlines()
    digest = base64.urlsafe_b64encode(hashlib.sha256(metadata).digest()).rstrip(b"=").decode()
    assert record == ["demo_pkg/__init__.py,sha256=x,10", f"demo_pkg-1.0.dist-info/METADATA,sha256={digest},"
                      f"{len(metadata)}", "demo_pkg-1.0.dist-info/RECORD,,"]
    assert b"Requires-Dist: numpy<1" not in metadata
