"""A reload() racing the first resolution of a shape must not deadlock (the selector and the
tiers each hold a lock; reload hooks run outside the tiers lock). Runs in a subprocess, because a
deadlocked process cannot be torn down."""
import subprocess, sys, textwrap

SCRIPT = textwrap.dedent('''
import os, threading
os.environ["TUNEDB_USER_DB"] = "off"
from tunedb.runtime import selector
from tunedb.database import tiers
from tunedb.records import Signature
SIG = Signature.parse("gemm|op=gemm|dt=bf16|N=64|K=32")
selector.configure("sm90")
a_in, b_in = threading.Event(), threading.Event()
real = selector._arch_state
def slow():                        # inside _choose, under selector._lock
    a_in.set(); b_in.wait(2); return real()
selector._arch_state = slow
def hook():                        # inside tiers.reload, under tiers._lock
    if threading.current_thread().name == "B": b_in.set()
tiers._reload_hooks.insert(0, hook)
a = threading.Thread(target=lambda: selector.resolve("gemm", SIG, 8), name="A", daemon=True)
b = threading.Thread(target=lambda: (a_in.wait(2), tiers.reload()), name="B", daemon=True)
a.start(); b.start(); a.join(5); b.join(5)
print("DEADLOCK" if (a.is_alive() or b.is_alive()) else "OK", flush=True)
os._exit(0)
''')

def test_reload_concurrent_with_first_resolution_does_not_deadlock():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "OK", out.stdout + out.stderr[-2000:]
