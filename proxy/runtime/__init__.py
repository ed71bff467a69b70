"""How the proxy waits and runs things side by side (gevent under gunicorn, plain threads elsewhere) and the Cancel that gives a fetch or search its deadline; imports only proxy.core."""
