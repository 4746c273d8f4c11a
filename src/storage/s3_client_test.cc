// The S3 client against a real S3-compatible server (s3rver), and its retries against a server
// that answers 503 SlowDown.
#include "storage/s3_client.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "storage/s3rver_test_util.h"

namespace tessera::storage {
namespace {

using test_util::S3rver;

std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + static_cast<size_t>(seed) * 7 + i / 977) & 0xff);
  return s;
}

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(server_.start(), ""); }
  ObjectUrl at(const std::string& key) const { return {S3rver::kBucket, key}; }
  S3rver server_;
};

TEST_F(S3ClientTest, PutGetRangeHeadListRemove) {
  S3Client s3(server_.options());
  const std::string body = pattern(100'000, 1);
  s3.put(at("run/a.bin"), body);
  s3.put(at("run/b.bin"), "b");
  s3.put(at("other/c.bin"), "c");
  EXPECT_EQ(s3.get(at("run/a.bin")), body);
  std::string part(1000, '\0');
  s3.get_range(at("run/a.bin"), 4321, 1000, part.data());
  EXPECT_EQ(part, body.substr(4321, 1000));
  EXPECT_EQ(s3.head(at("run/a.bin")), std::optional<uint64_t>(100'000));
  EXPECT_EQ(s3.head(at("run/none.bin")), std::nullopt);
  const std::vector<ObjectInfo> listed = s3.list(at("run/"));
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, "run/a.bin");
  EXPECT_EQ(listed[0].size, 100'000u);
  EXPECT_EQ(listed[1].key, "run/b.bin");
  s3.remove(at("run/a.bin"));
  s3.remove(at("run/a.bin"));  // already gone: not an error
  EXPECT_EQ(s3.head(at("run/a.bin")), std::nullopt);
  try {
    s3.get(at("run/a.bin"));
    FAIL() << "a missing key was read";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.status(), 404);
    EXPECT_NE(std::string(e.what()).find("s3://tessera-test/run/a.bin"), std::string::npos) << e.what();
  }
  const RequestCounts c = s3.counts();
  EXPECT_EQ(c.put, 3);
  EXPECT_EQ(c.retries, 0);
}

TEST_F(S3ClientTest, ListFollowsContinuationTokens) {
  S3Client s3(server_.options());
  for (int i = 0; i < 7; ++i) s3.put(at(fmt::format("many/k{}", i)), std::to_string(i));
  const std::vector<ObjectInfo> listed = s3.list(at("many/"), 3);
  ASSERT_EQ(listed.size(), 7u);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(listed[static_cast<size_t>(i)].key, fmt::format("many/k{}", i));
  EXPECT_EQ(s3.counts().list, 3);  // 3 + 3 + 1
}

TEST_F(S3ClientTest, MultipartUploadOfSeveralFilesInParallelParts) {
  S3Options o = server_.options();
  o.part_bytes = 64 << 10;
  o.parallelism = 3;
  S3Client s3(o);
  const std::string a = pattern(300'000, 2), b = pattern(123'457, 3);
  const std::string dir = server_.dir();
  std::ofstream(dir + "/a.bin", std::ios::binary) << a;
  std::ofstream(dir + "/b.bin", std::ios::binary) << b;
  // a's bytes 1000 onward, then b whole: one object of 422'457 bytes, 7 parts.
  s3.upload(at("node/object.bin"), {{dir + "/a.bin", 1000, a.size() - 1000}, {dir + "/b.bin", 0, b.size()}});
  EXPECT_EQ(s3.get(at("node/object.bin")), a.substr(1000) + b);
  const RequestCounts c = s3.counts();
  EXPECT_EQ(c.create_multipart, 1);
  EXPECT_EQ(c.upload_part, 7);
  EXPECT_EQ(c.complete_multipart, 1);
  EXPECT_EQ(c.put, 0);
  // Small enough for one PUT.
  s3.upload(at("node/small.bin"), {{dir + "/b.bin", 5, 1000}});
  EXPECT_EQ(s3.get(at("node/small.bin")), b.substr(5, 1000));
  EXPECT_EQ(s3.counts().put, 1);
}

TEST_F(S3ClientTest, WrongCredentialsAndMissingBucketAreNamedNotRetried) {
  S3Options o = server_.options();
  o.access_key = "NOT-A-KEY";
  o.secret_key = "very-secret-value";
  S3Client wrong(o);
  try {
    wrong.put(at("x"), "x");
    FAIL() << "wrong credentials were accepted";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.status(), 403);
    EXPECT_EQ(e.code(), "InvalidAccessKeyId");
    EXPECT_NE(std::string(e.what()).find("s3://tessera-test/x"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("very-secret-value"), std::string::npos) << e.what();
    EXPECT_EQ(e.exit_code(), kExitIo);
  }
  EXPECT_EQ(wrong.counts().retries, 0);
  S3Client s3(server_.options());
  try {
    s3.put({"no-such-bucket", "x"}, "x");
    FAIL() << "a missing bucket was written";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.code(), "NoSuchBucket");
    EXPECT_NE(std::string(e.what()).find("s3://no-such-bucket/x"), std::string::npos) << e.what();
  }
}

TEST_F(S3ClientTest, ConnectionErrorsAreRetriedUntilTheServerIsBack) {
  S3Options o = server_.options();
  o.attempts = 12;
  o.backoff_ms = 100;
  S3Client s3(o);
  s3.put(at("before"), "1");
  server_.stop();
  std::thread put([&] { s3.put(at("during"), "2"); });  // refused until the restart, then stored
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ASSERT_EQ(server_.start(), "");  // on the main thread: the server dies with the thread that forked it
  put.join();
  EXPECT_EQ(s3.get(at("during")), "2");
  EXPECT_GE(s3.counts().retries, 1);
  server_.stop();
  o.attempts = 3;
  o.backoff_ms = 10;
  S3Client gives_up(o);
  try {
    gives_up.put(at("after"), "3");
    FAIL() << "a put to a stopped server succeeded";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.status(), 0);
    EXPECT_NE(std::string(e.what()).find("gave up after 3 tries"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gives_up.counts().retries, 2);
}

// S3's throttling reply, twice, then success: the client backs off and the third try stores it.
TEST(S3ClientRetry, SlowDownIsRetriedWithBackoff) {
  httplib::Server server;
  std::atomic<int> calls{0};
  std::string stored;
  server.Put(R"(/bucket/(.*))", [&](const httplib::Request& req, httplib::Response& res) {
    if (calls++ < 2) {
      res.status = 503;
      res.set_content("<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
                      "application/xml");
      return;
    }
    stored = req.body;
    res.status = 200;
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread serve([&] { server.listen_after_bind(); });
  S3Options o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(port);
  o.access_key = o.secret_key = "k";
  o.backoff_ms = 10;
  S3Client s3(o);
  std::string error;
  try {
    s3.put({"bucket", "key"}, "payload");
  } catch (const Error& e) {
    error = e.what();
  }
  server.stop();
  serve.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(stored, "payload");
  EXPECT_EQ(s3.counts().retries, 2);
  EXPECT_EQ(s3.counts().put, 3);
}

TEST(ObjectUrl, ParsesS3AndRefusesOtherSchemes) {
  const ObjectUrl u = parse_s3("s3://my-bucket/runs/a/", "checkpoint.mirror_dir");
  EXPECT_EQ(u.bucket, "my-bucket");
  EXPECT_EQ(u.key, "runs/a");
  EXPECT_EQ(u.child("x").str(), "s3://my-bucket/runs/a/x");
  EXPECT_EQ(parse_s3("s3://my-bucket", "k").key, "");
  EXPECT_THROW(parse_s3("s3://My_Bucket/x", "k"), ConfigError);
  EXPECT_THROW(parse_s3("s3://bucket//x", "k"), ConfigError);
  EXPECT_NO_THROW(check_location("/data/runs", "k"));
  EXPECT_NO_THROW(check_location("relative/dir", "k"));
  try {
    check_location("gs://bucket/run", "checkpoint.mirror_dir");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.mirror_dir"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("gs://"), std::string::npos);
  }
}

TEST(S3Options, FromEnvironmentAndProfileFile) {
  const char* vars[] = {"AWS_ACCESS_KEY_ID",           "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",   "AWS_REGION",
                        "AWS_DEFAULT_REGION",          "AWS_ENDPOINT_URL",      "AWS_ENDPOINT_URL_S3", "AWS_PROFILE",
                        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"};
  for (const char* v : vars) ::unsetenv(v);
  test_util::S3rver scratch;  // only for its temporary directory
  const std::string creds = scratch.dir() + "/credentials", config = scratch.dir() + "/config";
  std::ofstream(creds) << "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s1\n"
                       << "[train]\naws_access_key_id=AKIDTRAIN\naws_secret_access_key=s2\naws_session_token = tok\n";
  std::ofstream(config) << "[profile train]\nregion = eu-west-3\n";
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", creds.c_str(), 1);
  ::setenv("AWS_CONFIG_FILE", config.c_str(), 1);
  ::setenv("AWS_PROFILE", "train", 1);
  S3Options o = s3_options_from_environment();
  EXPECT_EQ(o.access_key, "AKIDTRAIN");
  EXPECT_EQ(o.secret_key, "s2");
  EXPECT_EQ(o.session_token, "tok");
  EXPECT_EQ(o.region, "eu-west-3");
  ::setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "s3", 1);
  ::setenv("AWS_REGION", "us-west-2", 1);
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
  o = s3_options_from_environment();
  EXPECT_EQ(o.access_key, "AKIDENV");
  EXPECT_EQ(o.region, "us-west-2");
  EXPECT_EQ(o.endpoint, "http://127.0.0.1:9000");
  ::setenv("AWS_PROFILE", "absent", 1);
  ::unsetenv("AWS_ACCESS_KEY_ID");
  try {
    s3_options_from_environment();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[absent]"), std::string::npos) << e.what();
  }
  for (const char* v : vars) ::unsetenv(v);
}

TEST(S3Options, TesserasKnobsAreReadWhole) {
  ::setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
  ::setenv("TESSERA_S3_PART_MIB", "0.5", 1);
  ::setenv("TESSERA_S3_ATTEMPTS", "3", 1);
  const S3Options o = s3_options_from_environment();
  EXPECT_EQ(o.part_bytes, 512u << 10);
  EXPECT_EQ(o.attempts, 3);
  // A trailing unit or typo was read as its leading number ("8x" as 8).
  for (const auto& [var, value] : {std::pair{"TESSERA_S3_PART_MIB", "8x"}, std::pair{"TESSERA_S3_PART_MIB", "nan"},
                                   std::pair{"TESSERA_S3_PART_MIB", "0"}, std::pair{"TESSERA_S3_ATTEMPTS", "3x"},
                                   std::pair{"TESSERA_S3_ATTEMPTS", "0"}, std::pair{"TESSERA_S3_ATTEMPTS", "1.5"}}) {
    ::setenv("TESSERA_S3_PART_MIB", "0.5", 1);
    ::setenv("TESSERA_S3_ATTEMPTS", "3", 1);
    ::setenv(var, value, 1);
    try {
      s3_options_from_environment();
      ADD_FAILURE() << var << "=" << value << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(var) + " = \"" + value + "\""), std::string::npos) << e.what();
    }
  }
  for (const char* v : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "TESSERA_S3_PART_MIB", "TESSERA_S3_ATTEMPTS"}) {
    ::unsetenv(v);
  }
}

}  // namespace
}  // namespace tessera::storage
