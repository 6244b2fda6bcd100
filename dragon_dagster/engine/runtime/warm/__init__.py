"""The warm worker: one process per interpreter and library set that has imported torch, transformers, TRL and
PEFT once, and forks a child per job, so a job starts in well under a second instead of the seven or so that a
fresh interpreter spends importing them on a 2-core machine.

- protocol.py: where a warm worker listens, what makes a job's environment fit it, the messages on its socket;
- server.py: the warm process itself (imports, listens, forks a child per job, reaps it, sends its exit status);
- client.py: what a launcher calls: start a job in a forked child where it fits, a fresh interpreter where not.

A forked child is what a fresh worker process is: a session and process group of its own, the job's whole
environment, working directory, stdin/stdout/stderr (passed over the socket), umask and CPUs, default signal
handlers, its exit status, and the same command line in `ps`. Its parent is the warm process, so its watchdog
follows the launcher instead. One warm worker serves every project of its user, interpreter, checkout and cgroup:
server.py's docstring says what a job takes from its own launch (everything that names a project's stores) and
what from the warm worker (the libraries it imported, for a job whose import environment is its own).
"""
