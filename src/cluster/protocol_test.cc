#include "cluster/protocol.h"

#include <gtest/gtest.h>

#include <cstring>

namespace tandem::cluster {
namespace {

TEST(ProtocolTest, MessagesRoundTrip) {
  WorkerInfo w;
  w.name = "decode-0";
  w.role = Role::kDecode;
  w.host = "127.0.0.1";
  w.port = 4321;
  w.kv_segment = "decode-0.17/kv";
  w.block_tokens = 16;
  w.n_layers = 30;
  w.layer_slice_bytes = 12288;
  w.kv_blocks = 1024;
  w.incarnation = 17;
  w.max_num_seqs = 48;
  auto w2 = WorkerInfo::FromJson(w.ToJson());
  ASSERT_TRUE(w2.ok()) << w2.status().ToString();
  EXPECT_EQ(w2->name, "decode-0");
  EXPECT_EQ(w2->role, Role::kDecode);
  EXPECT_EQ(w2->port, 4321);
  EXPECT_EQ(w2->layer_slice_bytes, 12288u);
  EXPECT_EQ(w2->incarnation, 17);
  EXPECT_EQ(w2->max_num_seqs, 48);

  PrefillCall p;
  p.id = "cmpl-1";
  p.prompt_tokens = {1, 2, 3};
  p.sampling.temperature = 0.5f;
  p.sampling.seed = 7;
  p.sampling.tool_mode = engine::SamplingParams::ToolMode::kAuto;
  p.sampling.tool_format = engine::SamplingParams::ToolFormat::kMistral;
  p.sampling.max_tool_calls = 3;
  p.timeout_ms = 1234;
  p.target = {"decode-0.17/kv", {5, 9}, 16, 30, 12288, "decode-0", 0, {-1, 3}, 98304, 512};
  auto p2 = PrefillCall::FromJson(p.ToJson());
  ASSERT_TRUE(p2.ok()) << p2.status().ToString();
  EXPECT_EQ(p2->prompt_tokens, p.prompt_tokens);
  EXPECT_EQ(p2->target.blocks, (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(p2->target.window_blocks, (std::vector<int32_t>{-1, 3}));
  EXPECT_EQ(p2->target.window_arena_offset, 98304u);
  EXPECT_EQ(p2->target.window_tokens, 512);
  EXPECT_EQ(p2->sampling.seed, 7u);
  EXPECT_FLOAT_EQ(p2->sampling.temperature, 0.5f);
  EXPECT_EQ(p2->sampling.tool_mode, engine::SamplingParams::ToolMode::kAuto);
  EXPECT_EQ(p2->sampling.tool_format, engine::SamplingParams::ToolFormat::kMistral);
  EXPECT_EQ(p2->sampling.max_tool_calls, 3);

  DecodeEvent finish;
  finish.kind = DecodeEvent::Kind::kFinish;
  finish.finish.reason = serving::FinishReason::kStop;
  finish.finish.completion_tokens = 9;
  finish.finish.first_decode_seconds = 0.25;
  auto f2 = DecodeEvent::FromJson(finish.ToJson());
  ASSERT_TRUE(f2.ok());
  EXPECT_EQ(f2->finish.reason, serving::FinishReason::kStop);
  EXPECT_EQ(f2->finish.completion_tokens, 9);
  EXPECT_DOUBLE_EQ(f2->finish.first_decode_seconds, 0.25);

  DecodeEvent err;
  err.kind = DecodeEvent::Kind::kError;
  err.error = DeadlineExceeded("late");
  auto e2 = DecodeEvent::FromJson(err.ToJson());
  ASSERT_TRUE(e2.ok());
  EXPECT_EQ(e2->error.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(e2->error.message(), "late");

  auto rc = RoleChange::FromJson(RoleChange{Role::kPrefill, "queue"}.ToJson());
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(rc->role, Role::kPrefill);
  EXPECT_EQ(rc->reason, "queue");
  auto rr =
      RoleChangeResult::FromJson(RoleChangeResult{Role::kDecode, Role::kMixed, 2, 5}.ToJson());
  ASSERT_TRUE(rr.ok()) << rr.status().ToString();
  EXPECT_EQ(rr->role, Role::kDecode);
  EXPECT_EQ(rr->previous, Role::kMixed);
  EXPECT_EQ(rr->prefills_in_flight, 2);
  EXPECT_EQ(rr->decodes_in_flight, 5);
  EXPECT_FALSE(RoleChange::FromJson(R"({"role": "boss"})").ok());

  WorkerStats st;
  st.backend.busy_seconds_prefill = 2.5;
  st.backend.busy_seconds_decode = 0.75;
  st.backend.computed_tokens_prefill = 4096;
  st.backend.computed_tokens_decode = 77;
  st.backend.engine_threads = 3;
  st.cached_block_keys = {11, 12};
  st.backend.memory_plan = {{"kv", int64_t{5} << 30}, {"weights", 253 << 20}};
  st.backend.memory_budget_bytes = int64_t{6} << 30;
  st.backend.resident_bytes = 400 << 20;
  st.backend.peak_resident_bytes = 500 << 20;
  st.backend.preempt_offloaded_tokens = 320;
  st.backend.preempt_resumed_cache_tokens = 64;
  st.backend.preempt_resumed_pool_tokens = 256;
  st.backend.preempt_recomputed_tokens = 9;
  auto st2 = WorkerStats::FromJson(st.ToJson());
  ASSERT_TRUE(st2.ok()) << st2.status().ToString();
  EXPECT_DOUBLE_EQ(st2->backend.busy_seconds_prefill, 2.5);
  EXPECT_DOUBLE_EQ(st2->backend.busy_seconds_decode, 0.75);
  EXPECT_EQ(st2->backend.computed_tokens_prefill, 4096);
  EXPECT_EQ(st2->backend.computed_tokens_decode, 77);
  EXPECT_EQ(st2->backend.engine_threads, 3);
  EXPECT_EQ(st2->cached_block_keys, (std::vector<uint64_t>{11, 12}));
  EXPECT_EQ(st2->backend.memory_plan, st.backend.memory_plan);  // sorted by part already
  EXPECT_EQ(st2->backend.memory_budget_bytes, int64_t{6} << 30);
  EXPECT_EQ(st2->backend.resident_bytes, 400 << 20);
  EXPECT_EQ(st2->backend.peak_resident_bytes, 500 << 20);
  EXPECT_EQ(st2->backend.preempt_offloaded_tokens, 320);
  EXPECT_EQ(st2->backend.preempt_resumed_cache_tokens, 64);
  EXPECT_EQ(st2->backend.preempt_resumed_pool_tokens, 256);
  EXPECT_EQ(st2->backend.preempt_recomputed_tokens, 9);

  const Status back =
      StatusFromErrorJson(ErrorJson(Status(StatusCode::kResourceExhausted, "full")), "x");
  EXPECT_EQ(back.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(back.message(), "full");
}

// A pipelined prefill's stage description and the residual stream between stages survive the
// wire exactly; inconsistent stages and short chunks are refused.
TEST(ProtocolTest, PipelineStagesRoundTrip) {
  PrefillCall call;
  call.id = "cmpl-long";
  call.prompt_tokens = {1, 2, 3};
  call.target.blocks = {4};
  call.stage = {.session = "cmpl-long/1",
                .index = 0,
                .stages = 2,
                .begin_layer = 0,
                .end_layer = 11,
                .chunk_tokens = 512,
                .next_worker = "prefill-1",
                .next_host = "10.0.0.2",
                .next_port = 7001};
  auto back = PrefillCall::FromJson(call.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->stage.pipelined());
  EXPECT_FALSE(back->stage.last());
  EXPECT_EQ(back->stage.end_layer, 11);
  EXPECT_EQ(back->stage.chunk_tokens, 512);
  EXPECT_EQ(back->stage.session, "cmpl-long/1");
  EXPECT_EQ(back->stage.next_host, "10.0.0.2");
  EXPECT_EQ(back->stage.next_port, 7001);
  // Not pipelined: no stage on the wire.
  call.stage = {};
  EXPECT_FALSE(PrefillCall::FromJson(call.ToJson())->stage.pipelined());
  // The first stage without anyone to pass its output to, an empty range.
  call.stage = {.session = "s", .index = 0, .stages = 2, .begin_layer = 0, .end_layer = 11};
  EXPECT_EQ(PrefillCall::FromJson(call.ToJson()).status().code(), StatusCode::kInvalidArgument);
  call.stage = {.session = "s", .index = 1, .stages = 2, .begin_layer = 11, .end_layer = 11};
  EXPECT_EQ(PrefillCall::FromJson(call.ToJson()).status().code(), StatusCode::kInvalidArgument);
  call.stage = {.index = 1, .stages = 2, .begin_layer = 11, .end_layer = 18};  // no session
  EXPECT_EQ(PrefillCall::FromJson(call.ToJson()).status().code(), StatusCode::kInvalidArgument);

  StageInput in;
  in.id = "cmpl-long/1";
  in.start = 512;
  in.n = 2;
  in.last = true;
  in.hidden = {1.5f, -0.0f, 3e-39f, 7.25f, -1e30f, 0.1f};  // 2 tokens of width 3
  const std::string wire = in.Encode();
  auto got = StageInput::Decode(wire, 3);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->start, 512);
  EXPECT_TRUE(got->last);
  ASSERT_EQ(got->hidden.size(), in.hidden.size());
  EXPECT_EQ(0, std::memcmp(got->hidden.data(), in.hidden.data(), in.hidden.size() * 4));
  EXPECT_EQ(StageInput::Decode(wire, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(StageInput::Decode(wire.substr(0, wire.size() - 1), 3).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(StageInput::Decode("no header", 3).status().code(), StatusCode::kInvalidArgument);
  // A failed stage says so, with its error.
  StageInput failed;
  failed.id = "cmpl-long";
  failed.error = DeadlineExceeded("stage 0 ran out of time");
  auto news = StageInput::Decode(failed.Encode(), 3);
  ASSERT_TRUE(news.ok());
  EXPECT_EQ(news->error.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(news->error.message(), "stage 0 ran out of time");
}

TEST(ProtocolTest, BadMessagesAreRefusedClearly) {
  EXPECT_EQ(DecodeCall::FromJson("not json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeCall::FromJson("[1,2]").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeCall::FromJson(R"({"id":"a"})").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeCall::FromJson(R"({"id":"","prompt_tokens":[1],"max_tokens":2})").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      DecodeCall::FromJson(R"({"id":"a","prompt_tokens":["x"],"max_tokens":2})").status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeCall::FromJson(R"({"id":"a","prompt_tokens":[1],"max_tokens":2,"timeout_ms":-5})")
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PrefillCall::FromJson(R"({"id":"a","prompt_tokens":[1]})").status().code(),
            StatusCode::kInvalidArgument);  // no target
  EXPECT_EQ(
      WorkerInfo::FromJson(R"({"name":"w","role":"boss","host":"h","port":1})").status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(WorkerInfo::FromJson(R"({"name":"w","role":"decode","host":"h","port":70000})")
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeEvent::FromJson(R"({"event":"party"})").status().code(),
            StatusCode::kInvalidArgument);
  // Found by fuzz/fuzz_worker_protocol.cc: a float too large for the integer (or float) it is
  // read into was cast anyway (undefined behaviour); such numbers are refused up front.
  EXPECT_EQ(
      DecodeCall::FromJson(R"({"id":"a","prompt_tokens":[1],"max_tokens":1.8e20})").status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeCall::FromJson(
                R"({"id":"a","prompt_tokens":[1],"max_tokens":2,"sampling":{"temperature":1e300}})")
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  // A migrated stream's output travels with a local decode call only.
  DecodeCall resumed;
  resumed.id = "r";
  resumed.prompt_tokens = {1, 2};
  resumed.local = true;
  resumed.resumed_output = {7, 8, 9};
  auto back = DecodeCall::FromJson(resumed.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->resumed_output, (std::vector<int32_t>{7, 8, 9}));
  resumed.local = false;
  EXPECT_EQ(DecodeCall::FromJson(resumed.ToJson()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusFromErrorJson("garbage", "fallback").message(), "fallback");
  EXPECT_FALSE(ParseRole("x").ok());
  EXPECT_EQ(*ParseRole("prefill"), Role::kPrefill);
}

}  // namespace
}  // namespace tandem::cluster
