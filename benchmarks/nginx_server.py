"""nginx from Debian's packages on 127.0.0.1, serving a folder with Range support and a fixed latency per request
(the echo module's echo_sleep, then the static file handler): a real web server as the remote baseline.

    apt-get install nginx libnginx-mod-http-echo
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"
CONFIG = """load_module {module};
{user}
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp};
  scgi_temp_path {tmp};
  keepalive_requests 100000;
  server {{
    listen 127.0.0.1:{port};
    location / {{ {sleep} echo_exec @files; }}
    location @files {{ root {root}; }}
  }}
}}
"""


def available() -> bool:
    return (shutil.which("nginx") is not None or Path("/usr/sbin/nginx").exists()) and Path(ECHO_MODULE).exists()


@contextlib.contextmanager
def serve(root: str, latency: float = 0.0):
    """Serve root on a free loopback port; yields the base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="atlas-nginx-") as tmp:
        config = Path(tmp, "nginx.conf")
        sleep = f"echo_sleep {latency};" if latency else ""
        user = "user root;" if os.geteuid() == 0 else ""  # workers read the folder as whoever runs the benchmark
        config.write_text(CONFIG.format(module=ECHO_MODULE, user=user, tmp=tmp, port=port, root=root, sleep=sleep))
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        process = subprocess.Popen([binary, "-c", str(config)], stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(url + "/", timeout=1)
                except urllib.error.HTTPError:
                    break  # answering (404 for the folder itself)
                except OSError:
                    time.sleep(0.05)
                else:
                    break
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)
