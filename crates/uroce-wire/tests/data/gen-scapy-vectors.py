#!/usr/bin/env python3
"""Writes icrc-scapy.txt: RoCEv2 packets whose ICRC was computed by scapy's independent
implementation (scapy.contrib.roce, BTH.compute_icrc), over IPv6 and IPv4, with the fields the
ICRC masks (traffic class, flow label, hop limit, TOS, TTL, checksums) set to non-default values.

    pip install scapy && python3 gen-scapy-vectors.py > icrc-scapy.txt
"""
import struct

import scapy
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw


def v6():
    return IPv6(src="fd00::2", dst="fd00::3", tc=0xb8, fl=0x12345, hlim=7)


def v4():
    return IP(src="10.0.0.2", dst="10.0.0.3", tos=0x62, ttl=9, id=0x1234, flags="DF")


def udp(sport):
    return UDP(sport=sport, dport=4791)


packets = [
    ("v6_rc_send_only", v6() / udp(49152) / BTH(opcode=0x04, dqpn=0x11, psn=0xFFFFFF, ackreq=1)
     / Raw(bytes(range(20)))),
    ("v6_rc_ack", v6() / udp(49153) / BTH(opcode=0x11, dqpn=0x12, psn=5) / AETH(syndrome=0x1F, msn=7)),
    # UD SEND_ONLY: DETH (Q_Key 0x11111111, source QP 0x000032) then 12 bytes of payload.
    ("v6_ud_send_only", v6() / udp(49154) / BTH(opcode=0x64, dqpn=0x31, psn=1, becn=1)
     / Raw(struct.pack("!IB3s", 0x11111111, 0, (0x32).to_bytes(3, "big")) + b"hello, roce!")),
    # RC RDMA WRITE ONLY: RETH (va, rkey, len) then 5 bytes of payload and 3 of pad.
    ("v4_rc_write_only_pad3", v4() / udp(49155) / BTH(opcode=0x0A, dqpn=0x13, psn=9, padcount=3, ackreq=1)
     / Raw(struct.pack("!QII", 0x7F0000001000, 0xABCD, 5) + b"abcde" + b"\0\0\0")),
]

print("# RoCEv2 packets whose ICRC was computed by scapy %s (scapy.contrib.roce), an implementation" % scapy.VERSION)
print("# independent of uroce's. Each line: a name, then hex bytes from the first byte of the IP header")
print("# through the ICRC. Written by gen-scapy-vectors.py beside this file.")
for name, p in packets:
    print(name, bytes(p).hex())
