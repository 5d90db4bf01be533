"""The lab's Python client stack: grpcio (gRPC C-core) for push's calls to the gateways and
websockets for the users' connections. The lab drives it over JSON lines (commands on stdin,
events on stdout) and does all the OpenIM-specific work itself: it encodes the push request and
decodes the answer, so calls go through grpcio's generic API with raw bytes, no generated stubs.

    lab_clients.py push  --family ipv4|dual-stack [--reuse]   one gRPC call per command, each on a new
                                                              connection (with --reuse: one per gateway)
    lab_clients.py users --family ipv4|dual-stack   one WebSocket per command, reports each text message

Runs from the virtualenv `cargo xtask setup` makes (see tests/src/lab/stack.rs).
"""

import argparse
import asyncio
import base64
import json
import socket
import sys

import grpc
from websockets.asyncio.client import connect

CALL_TIMEOUT = 5.0


def emit(event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def grpc_target(address, family):
    """grpcio's target for `ip:port`. C-core decides the socket itself: with `ipv4:` it still
    opens an IPv6 socket to the IPv4-mapped address whenever the namespace has IPv6 (see
    tests/README.md); `ipv6:` with the mapped address asks for that socket explicitly."""
    host, port = address.rsplit(":", 1)
    if family == "ipv4":
        return f"ipv4:{host}:{port}"
    return f"ipv6:[::ffff:{host}]:{port}"


def push(family, reuse):
    """Makes each call on a new channel with its own connection and never closes it, as OpenIM
    3.5.1 push does; with reuse, keeps one channel per gateway and authority, as 3.6 and later
    do."""
    leaked = []
    kept = {}
    for line in sys.stdin:
        try:
            call = json.loads(line)
        except ValueError as error:
            emit({"id": 0, "error": f"bad command: {error}"})
            continue
        answer = {"id": call["id"]}
        key = (call["target"], call["authority"])
        channel = kept.get(key)
        if channel is None:
            channel = grpc.insecure_channel(
                grpc_target(call["target"], family),
                options=[
                    ("grpc.default_authority", call["authority"]),
                    # Channels share connections through a global pool unless told otherwise.
                    ("grpc.use_local_subchannel_pool", 1),
                ],
            )
            leaked.append(channel)
            if reuse:
                kept[key] = channel
        method = channel.unary_unary(
            call["method"], request_serializer=None, response_deserializer=None
        )
        try:
            response = method(
                base64.b64decode(call["request"]),
                timeout=CALL_TIMEOUT,
                wait_for_ready=True,
            )
            answer["response"] = base64.b64encode(response).decode()
        except grpc.RpcError as error:
            answer["error"] = f"{error.code()}: {error.details()}"
        emit(answer)


async def open_socket(address, family):
    """A connected non-blocking socket to `ip:port`: IPv4, or IPv6 to the IPv4-mapped address."""
    host, port = address.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    if family == "ipv4":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        target = (host, int(port))
    else:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        target = (f"::ffff:{host}", int(port))
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        await loop.sock_connect(sock, target)
    except OSError:
        sock.close()
        raise
    return sock


async def user_session(user, family):
    try:
        sock = await asyncio.wait_for(open_socket(user["address"], family), CALL_TIMEOUT)
        websocket = await connect(user["url"], sock=sock, open_timeout=CALL_TIMEOUT)
    except Exception as error:  # every failure is the user's connect error, reported to the lab
        emit({"event": "failed", "user": user["user"], "error": repr(error)})
        return
    emit({"event": "connected", "user": user["user"]})
    try:
        async for message in websocket:
            if not isinstance(message, str):
                continue
            try:
                client_msg_id = json.loads(message).get("clientMsgID")
            except (ValueError, AttributeError):
                continue
            if client_msg_id:
                emit({"event": "arrived", "user": user["user"], "client_msg_id": client_msg_id})
    except Exception:  # the lab closing the connection ends the session
        pass


async def users(family):
    """Opens each user's WebSocket and reports every message that arrives on it. The
    connections stay open until stdin closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=16 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    sessions = set()
    while line := await reader.readline():
        try:
            user = json.loads(line)
        except ValueError as error:
            emit({"event": "failed", "user": "", "error": f"bad command: {error}"})
            continue
        task = asyncio.create_task(user_session(user, family))
        sessions.add(task)
        task.add_done_callback(sessions.discard)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["push", "users"])
    parser.add_argument("--family", choices=["ipv4", "dual-stack"], default="ipv4")
    parser.add_argument("--reuse", action="store_true", help="push: one channel per gateway")
    args = parser.parse_args()
    if args.mode == "push":
        push(args.family, args.reuse)
    else:
        asyncio.run(users(args.family))


if __name__ == "__main__":
    main()
