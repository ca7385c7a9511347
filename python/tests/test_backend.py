"""The in-tree build backend (python/_backend): the wheel it builds, and
its TOML reader for interpreters without tomllib."""

import base64
import hashlib
import os
import sys
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HERE, "_backend"))

import gpufs_backend  # noqa: E402

try:
    import tomllib
except ImportError:  # pragma: no cover (before Python 3.11)
    tomllib = None


class BackendTest(unittest.TestCase):
    @unittest.skipIf(tomllib is None, "no tomllib to compare with")
    def test_toml_subset_reads_pyproject_as_tomllib_does(self):
        with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
            data = f.read()
        want = tomllib.loads(data.decode())
        got = gpufs_backend._parse_toml_subset(data.decode())
        self.assertEqual(got["build-system"], want["build-system"])
        project = dict(want["project"])
        self.assertEqual(got["project.optional-dependencies"], project.pop("optional-dependencies"))
        self.assertEqual(got["project"], project)

    def test_wheel_holds_the_package_and_a_true_record(self):
        with open(os.path.join(HERE, "pyproject.toml")) as f:
            version = gpufs_backend._parse_toml_subset(f.read())["project"]["version"]
        base = "gpufs-" + version
        with tempfile.TemporaryDirectory() as out:
            name = gpufs_backend.build_wheel(out)
            self.assertEqual(name, base + "-py3-none-any.whl")
            with zipfile.ZipFile(os.path.join(out, name)) as whl:
                names = whl.namelist()
                for module in ("__init__.py", "_uapi.py", "py.typed"):
                    self.assertIn("gpufs/" + module, names)
                self.assertFalse([n for n in names if "__pycache__" in n or n.endswith(".pyc")])
                record = whl.read(base + ".dist-info/RECORD").decode().splitlines()
                self.assertEqual(len(record), len(names))
                for line in record:
                    path, digest, size = line.rsplit(",", 2)
                    if path.endswith("RECORD"):
                        continue
                    data = whl.read(path)
                    want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                    self.assertEqual((digest, int(size)), ("sha256=" + want.decode(), len(data)))
                metadata = whl.read(base + ".dist-info/METADATA").decode()
                self.assertIn("Requires-Python: >=3.9", metadata)
                self.assertIn('Requires-Dist: numpy; extra == "numpy"', metadata)


if __name__ == "__main__":
    unittest.main()
