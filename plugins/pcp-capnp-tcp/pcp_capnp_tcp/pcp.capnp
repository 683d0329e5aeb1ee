# The header of one PCP frame. A frame on the wire is
#   prefix (magic "PCPc", header length u32, payload length u64; little-endian)
#   this Frame, in Cap'n Proto's standard (unpacked) serialization
#   the payload: each tensor's raw little-endian bytes, in the order of `tensors`.
# Tensors never live in a Data field here: Data fields are capped at 512 MiB, and
# building them costs a copy the raw payload avoids.
#
# One struct per message of pcp_core.messages, fields in lowerCamelCase of the
# dataclass fields (the `tensors` field of a message travels as `Frame.tensors`).

@0xac6be0cad215048d;

struct Frame {
  version @0 :UInt32;  # pcp_core.messages.PROTOCOL_VERSION
  message :union {
    hello @1 :Hello;
    challenge @2 :Challenge;
    proof @3 :Proof;
    welcome @4 :Welcome;
    reject @5 :Reject;
    setup @6 :Setup;
    assignment @7 :Assignment;
    result @8 :Result;
    stop @9 :Stop;
    failure @10 :Failure;
    fetch @12 :Fetch;
    discard @13 :Discard;
    delta @14 :Delta;
    heartbeat @15 :Heartbeat;
    seal @16 :Seal;
    ready @17 :Ready;
    shardRequest @18 :ShardRequest;
    shardData @19 :ShardData;
    audit @20 :Audit;
    auditState @21 :AuditState;
  }
  tensors @11 :List(TensorHeader);
}

struct TensorHeader {
  name @0 :Text;
  dtype @1 :Text;  # numpy dtype name ("float32", "bfloat16", ...); bytes are little-endian
  shape @2 :List(UInt64);
  nbytes @3 :UInt64;
}

struct Hello {
  workerName @0 :Text;
  backend @1 :Text;
  arch @2 :Text;
  runtime @3 :Text;  # JSON
  device @4 :Text;
  previousIndex @5 :Int32;
  credential @6 :Text;  # the serial of the worker's own credential; empty: a shared secret
}

struct Challenge {
  nonce @0 :Data;
}

struct Proof {
  mac @0 :Data;
  nonce @1 :Data;
}

struct Welcome {
  workerIndex @0 :UInt32;
  mac @1 :Data;
  heartbeatS @2 :Float64;
}

struct Reject {
  reason @0 :Text;
}

struct Setup {
  artifactSha256 @0 :Text;
  settingsJson @1 :Text;
  artifactKind @2 :Text;
}

struct Assignment {
  round @0 :UInt64;
  innerSteps @1 :UInt32;
  shardIndex @2 :UInt32;
  shardCount @3 :UInt32;
  seed @4 :Int64;
  attempt @5 :UInt32;
  budgetS @6 :Float64;
  scheduleStep @7 :Int64 = -1;
  continues @8 :Bool;
}

struct Result {
  round @0 :UInt64;
  losses @1 :List(Float64);
  computeS @2 :Float64;
  attempt @3 :UInt32;
  norm @4 :Float64;
  waitedS @5 :Float64;
  sentS @6 :Float64;
  encodeS @7 :Float64;
  ahead @8 :Bool;
  stateDigest @9 :Text;  # "" unless the run is audited
}

struct Fetch {
  round @0 :UInt64;
  attempt @1 :UInt32;
}

struct Discard {
  round @0 :UInt64;
  attempt @1 :UInt32;
  reason @2 :Text;
}

struct Delta {
  round @0 :UInt64;
  attempt @1 :UInt32;
}

struct Audit {
  round @0 :UInt64;
  attempt @1 :UInt32;
}

struct AuditState {
  round @0 :UInt64;
  attempt @1 :UInt32;
}

struct Heartbeat {}

struct Ready {}

struct ShardRequest {
  name @0 :Text;
}

struct ShardData {
  name @0 :Text;
  offset @1 :UInt64;
  size @2 :UInt64;
}

struct Seal {
  mac @0 :Data;
}

struct Stop {
  reason @0 :Text;
}

struct Failure {
  reason @0 :Text;
}
