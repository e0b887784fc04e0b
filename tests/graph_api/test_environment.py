"""What ``import graph_api`` sets in the environment (subprocesses: a fresh interpreter each)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _timeout_after(code: str, **env) -> str:
    run_env = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_THREAD_TIMEOUT", "GRAPH_API_NUMBA_DEFAULTS")}
    run_env.update(env)
    out = subprocess.run([sys.executable, "-c", code + "; import os; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"],
                         cwd=ROOT, env=run_env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_graph_api_before_numpy_shortens_the_openblas_spin():
    assert _timeout_after("import graph_api") == "4"


def test_a_user_value_and_numpy_loaded_first_are_left_alone():
    assert _timeout_after("import graph_api", OPENBLAS_THREAD_TIMEOUT="9") == "9"
    assert _timeout_after("import numpy, graph_api") == "None"
    assert _timeout_after("import graph_api", GRAPH_API_NUMBA_DEFAULTS="0") == "None"
