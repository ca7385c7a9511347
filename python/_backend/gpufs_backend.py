"""The gpufs package's PEP 517 build backend, kept in the source tree.

`pip install ./python` then needs nothing from a package index: no
setuptools, no wheel. (A fresh virtual environment has neither, and pip's
build isolation would fetch them, so the install failed offline.) The
package is pure Python: the wheel holds gpufs/ as it is (a libgpufs.so
copied next to it included), its metadata taken from pyproject.toml's
[project] table; `pip install -e` gets a wheel whose .pth file points here.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
PACKAGE = "gpufs"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip entries' time: the same wheel from the same tree


def _parse_toml_subset(text):
    """The tables of `text` as dicts, for the TOML this pyproject.toml uses:
    [table] headers, comments, and key = "string" | [strings] (over several
    lines too). For interpreters without tomllib (before Python 3.11)."""
    tables, current = {}, {}
    tables[""] = current
    pending_key, pending = None, ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip() if '"' not in raw else raw.strip()
        if pending_key is not None:
            pending += " " + line
            if "]" in line:
                current[pending_key] = re.findall(r'"((?:[^"\\]|\\.)*)"', pending)
                pending_key = None
            continue
        if not line or line.startswith("#"):
            continue
        header = re.fullmatch(r"\[([A-Za-z0-9_.\-]+)\]", line)
        if header:
            current = tables.setdefault(header.group(1), {})
            continue
        key, _, value = (part.strip() for part in line.partition("="))
        key = key.strip('"')
        if value.startswith("["):
            if "]" in value:
                current[key] = re.findall(r'"((?:[^"\\]|\\.)*)"', value)
            else:
                pending_key, pending = key, value
        elif value.startswith('"'):
            current[key] = re.match(r'"((?:[^"\\]|\\.)*)"', value).group(1)
    return tables


def _project():
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        data = f.read()
    try:
        import tomllib
    except ImportError:
        tables = _parse_toml_subset(data.decode("utf-8"))
        project = dict(tables.get("project", {}))
        project["optional-dependencies"] = tables.get("project.optional-dependencies", {})
        return project
    return tomllib.loads(data.decode("utf-8"))["project"]


def _dist_info(project):
    return f"{project['name']}-{project['version']}.dist-info"


def _metadata(project):
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}",
             f"Version: {project['version']}", f"Summary: {project.get('description', '')}"]
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    readme = project.get("readme")
    body = ""
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(HERE, readme), encoding="utf-8") as f:
            body = f.read()
    return ("\n".join(lines) + "\n\n" + body).encode("utf-8")


def _wheel_file():
    return (b"Wheel-Version: 1.0\nGenerator: gpufs_backend\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n")


def _package_files():
    """(path in the wheel, path here) of every file of the package."""
    root = os.path.join(HERE, PACKAGE)
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(base, name)
            yield os.path.relpath(full, HERE).replace(os.sep, "/"), full


def _write_wheel(directory, contents):
    """Writes the wheel of (name, bytes) `contents` plus its RECORD; returns its file name."""
    project = _project()
    dist_info = _dist_info(project)
    contents = list(contents) + [(f"{dist_info}/METADATA", _metadata(project)),
                                 (f"{dist_info}/WHEEL", _wheel_file())]
    record = []
    name = f"{project['name']}-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, data in contents:
            info = zipfile.ZipInfo(arcname, _EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{arcname},sha256={digest.decode()},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", _EPOCH)
        info.external_attr = 0o644 << 16
        whl.writestr(info, "\n".join(record) + "\n")
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# -- the PEP 517 / PEP 660 hooks ------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    project = _project()
    dist_info = os.path.join(metadata_directory, _dist_info(project))
    os.makedirs(dist_info, exist_ok=True)
    for name, data in (("METADATA", _metadata(project)), ("WHEEL", _wheel_file())):
        with open(os.path.join(dist_info, name), "wb") as f:
            f.write(data)
    return os.path.basename(dist_info)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory,
                        [(arcname, _read(full)) for arcname, full in _package_files()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(f"_{PACKAGE}_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = f"{project['name']}-{project['version']}"
    name = f"{base}.tar.gz"
    files = [("pyproject.toml", os.path.join(HERE, "pyproject.toml")),
             ("_backend/gpufs_backend.py", os.path.abspath(__file__))]
    if project.get("readme"):
        files.append((project["readme"], os.path.join(HERE, project["readme"])))
    files += list(_package_files())
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for arcname, data in [("PKG-INFO", _metadata(project))] + \
                [(arcname, _read(full)) for arcname, full in files]:
            info = tarfile.TarInfo(f"{base}/{arcname}")
            info.size, info.mode, info.mtime = len(data), 0o644, 315532800
            tar.addfile(info, io.BytesIO(data))
    return name
