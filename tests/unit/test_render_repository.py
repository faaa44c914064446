"""A rendered model repository runs the core of the checkout that rendered it: the Python
backend's stub interpreter is isolated (PYTHONPATH ignored), so each Python model's folder links
this checkout's ``banditspec`` package, found on the stub's sys.path before an installed copy."""

import shutil
import subprocess
import sys

from banditspec_server.serve import CORE_PACKAGE, SOURCE_REPOSITORY, render_repository


def test_each_python_model_folder_links_this_checkouts_core():
    out = render_repository({})
    try:
        python_models = [d for d in SOURCE_REPOSITORY.iterdir() if (d / "1" / "model.py").exists()]
        assert {d.name for d in python_models} >= {"banditspec", "target", "eagle"}
        for model in python_models:
            link = out / model.name / "banditspec"
            assert link.is_symlink() and link.resolve() == CORE_PACKAGE.resolve(), model.name
        # an isolated interpreter with the model folder last on its path, as the stub has it, imports this checkout's core
        found = subprocess.run(
            [sys.executable, "-I", "-c", f"import sys; sys.path.append({str(out / 'target')!r}); "
             "import banditspec.errors as e; print(e.__file__)"],
            capture_output=True, text=True, check=True).stdout.strip()
        assert found.startswith(str(out / "target" / "banditspec")), found
    finally:
        shutil.rmtree(out, ignore_errors=True)
