"""The test kit: what more than one test module (or a bench/ script) needs, written once.

- `settings`: the tiniest arm overrides that still train, and the test clients' API token.
- `net`: a free loopback port.
- `nodes`: a node row on the loopback OpenSSH server.
- `clock`: a sweep runner's clock the test moves.
- `polling`: waiting on something real without timing assertions.
- `readers`: a run, its metrics and its events as the database holds them.
- `launcher`: the launcher on a module's local Ray, as pytest fixtures (a plugin of tests/conftest.py).
- `bed`: the namespace test bed with this checkout's Python and source, and what runs on it.
"""
