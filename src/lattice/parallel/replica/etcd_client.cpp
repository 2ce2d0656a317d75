// EtcdClient: see etcd_client.hpp. HTTP/1.1 over a plain socket, one request per connection
// (Connection: close), answers with Content-Length or chunked bodies.
#include "lattice/parallel/replica/etcd_client.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"

namespace lattice::replica {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// Closes the socket when it goes out of scope.
struct Socket {
  int fd = -1;
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// Waits until `fd` is ready for `events` or the deadline passes (false).
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

// The decoded body of an HTTP/1.1 answer: its Content-Length or chunked body, or all after the
// headers.
std::string http_body(const std::string& answer, int& status) {
  const size_t header_end = answer.find("\r\n\r\n");
  check(header_end != std::string::npos && answer.rfind("HTTP/1.", 0) == 0,
        "the store's answer is not HTTP");
  status = std::atoi(answer.c_str() + answer.find(' ') + 1);
  std::string headers = answer.substr(0, header_end);
  for (char& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string body = answer.substr(header_end + 4);
  if (headers.find("transfer-encoding: chunked") == std::string::npos) return body;
  std::string out;
  for (size_t at = 0; at < body.size();) {
    const size_t line_end = body.find("\r\n", at);
    if (line_end == std::string::npos) break;
    const size_t size = std::stoul(body.substr(at, line_end - at), nullptr, 16);
    if (size == 0) break;
    out += body.substr(line_end + 2, size);
    at = line_end + 2 + size + 2;
  }
  return out;
}

// The range_end that makes a range of every key starting with `prefix`.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

int64_t json_int(const json& value) {
  if (value.is_string()) return std::stoll(value.get<std::string>());
  return value.is_number() ? value.get<int64_t>() : 0;
}

}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) n |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) n |= static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    if (c == '=') break;
    const char* at = std::strchr(kAlphabet, c);
    check(at != nullptr && c != '\0', "the store sent a value that is not base64");
    bits = (bits << 6) | static_cast<uint32_t>(at - kAlphabet);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out += static_cast<char>((bits >> count) & 0xff);
    }
  }
  return out;
}

EtcdClient::EtcdClient(std::string endpoint, std::chrono::milliseconds timeout)
    : endpoint_(std::move(endpoint)), timeout_(timeout) {
  std::string text = endpoint_;
  if (text.rfind("http://", 0) == 0) text = text.substr(7);
  const size_t colon = text.rfind(':');
  check(colon != std::string::npos && colon > 0 && colon + 1 < text.size(),
        "replica store '" + endpoint_ + "' is not host:port (e.g. 127.0.0.1:2379)");
  host_ = text.substr(0, colon);
  try {
    port_ = std::stoi(text.substr(colon + 1));
  } catch (const std::exception&) {
    port_ = 0;
  }
  check(port_ > 0 && port_ < 65536,
        "replica store '" + endpoint_ + "' has no valid port (e.g. 127.0.0.1:2379)");
}

std::string EtcdClient::post(const std::string& path, const std::string& body) {
  const auto deadline = Clock::now() + timeout_;
  const std::string where = "the replica store (etcd) at " + endpoint_;
  const std::string fix = ": start etcd there (etcd --listen-client-urls http://" + endpoint_ +
                          " --advertise-client-urls http://" + endpoint_ +
                          ") or set replica.store to where it runs";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  check(::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found) == 0 && found,
        "cannot resolve " + where + fix);
  Socket s;
  s.fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int connected = s.fd < 0 ? -1 : ::connect(s.fd, found->ai_addr, found->ai_addrlen);
  const int connect_errno = errno;
  ::freeaddrinfo(found);
  check(s.fd >= 0, "cannot open a socket for " + where);
  if (connected != 0) {
    check(connect_errno == EINPROGRESS,
          "cannot reach " + where + " (" + std::strerror(connect_errno) + ")" + fix);
    check(wait_ready(s.fd, POLLOUT, deadline),
          "cannot reach " + where + " within " + std::to_string(timeout_.count()) + " ms" + fix);
    int error = 0;
    socklen_t length = sizeof(error);
    ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &error, &length);
    check(error == 0, "cannot reach " + where + " (" + std::strerror(error) + ")" + fix);
  }
  const std::string request =
      "POST " + path + " HTTP/1.1\r\nHost: " + host_ +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n" + body;
  for (size_t sent = 0; sent < request.size();) {
    check(wait_ready(s.fd, POLLOUT, deadline),
          where + " did not take a request within " + std::to_string(timeout_.count()) + " ms");
    const ssize_t n = ::send(s.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    check(n > 0 || errno == EAGAIN || errno == EINTR,
          "lost the connection to " + where + " (" + std::strerror(errno) + ")");
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string answer;
  char buffer[8192];
  while (true) {
    check(wait_ready(s.fd, POLLIN, deadline),
          where + " did not answer within " + std::to_string(timeout_.count()) + " ms");
    const ssize_t n = ::recv(s.fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      check(errno == EAGAIN || errno == EINTR,
            "lost the connection to " + where + " (" + std::strerror(errno) + ")");
      continue;
    }
    answer.append(buffer, static_cast<size_t>(n));
  }
  int status = 0;
  const std::string text = http_body(answer, status);
  if (status != 200) {
    std::string message = text;
    try {
      message = json::parse(text).value("message", text);
    } catch (const json::exception&) {
    }
    throw Error(where + " refused " + path + " (HTTP " + std::to_string(status) + "): " + message);
  }
  return text;
}

void EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  json body = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  post("/v3/kv/put", body.dump());
}

std::optional<std::string> EtcdClient::get(const std::string& key) {
  const json answer = json::parse(post("/v3/kv/range", json{{"key", base64_encode(key)}}.dump()));
  if (!answer.contains("kvs") || answer["kvs"].empty()) return std::nullopt;
  return base64_decode(answer["kvs"][0].value("value", ""));
}

std::vector<KeyValue> EtcdClient::get_prefix(const std::string& prefix) {
  const json request = {{"key", base64_encode(prefix)},
                        {"range_end", base64_encode(prefix_end(prefix))},
                        {"sort_order", "ASCEND"},
                        {"sort_target", "KEY"}};
  const json answer = json::parse(post("/v3/kv/range", request.dump()));
  std::vector<KeyValue> out;
  if (!answer.contains("kvs")) return out;
  for (const json& kv : answer["kvs"])
    out.push_back({base64_decode(kv.value("key", "")), base64_decode(kv.value("value", "")),
                   kv.contains("lease") ? json_int(kv["lease"]) : 0});
  return out;
}

void EtcdClient::remove(const std::string& key) {
  post("/v3/kv/deleterange", json{{"key", base64_encode(key)}}.dump());
}

void EtcdClient::remove_prefix(const std::string& prefix) {
  post("/v3/kv/deleterange",
       json{{"key", base64_encode(prefix)}, {"range_end", base64_encode(prefix_end(prefix))}}
           .dump());
}

bool EtcdClient::create(const std::string& key, const std::string& value, int64_t lease) {
  json put = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const json request = {{"compare", json::array({{{"key", base64_encode(key)},
                                                  {"result", "EQUAL"},
                                                  {"target", "CREATE"},
                                                  {"create_revision", "0"}}})},
                        {"success", json::array({{{"request_put", put}}})}};
  const json answer = json::parse(post("/v3/kv/txn", request.dump()));
  return answer.value("succeeded", false);
}

int64_t EtcdClient::grant_lease(int64_t ttl_seconds) {
  check(ttl_seconds > 0, "a store lease needs a positive time to live");
  const json answer =
      json::parse(post("/v3/lease/grant", json{{"TTL", std::to_string(ttl_seconds)}}.dump()));
  const int64_t id = answer.contains("ID") ? json_int(answer["ID"]) : 0;
  check(id != 0, "the replica store (etcd) at " + endpoint_ + " granted no lease");
  return id;
}

bool EtcdClient::keep_alive(int64_t lease) {
  const json answer =
      json::parse(post("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump()));
  const json& result = answer.contains("result") ? answer["result"] : answer;
  return result.contains("TTL") && json_int(result["TTL"]) > 0;
}

void EtcdClient::revoke_lease(int64_t lease) {
  post("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump());
}

}  // namespace lattice::replica
