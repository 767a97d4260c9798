"""A TCP relay on 127.0.0.1 to the port given as its argument; prints the port it listens on.

Run as another user (`setpriv --reuid=65534 …`), it stands for a relay, a container or another
user's agent: the gateway cannot name the process behind the connections it carries. Passed
as `python3 -c` text (that user may not be able to read the checkout). Used by
the integration tests (`paths::ForeignRelay`) and the fault campaign (`tests/chaos`).
"""
import socket
import sys
import threading

srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(64)
print(srv.getsockname()[1], flush=True)


def pipe(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


while True:
    c, _ = srv.accept()
    try:
        u = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    except OSError:
        c.close()
        continue
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
