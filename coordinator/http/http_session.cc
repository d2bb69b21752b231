#include "coordinator/http/http_session.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "coordinator/http/openai_error.h"

namespace baton::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = boost::asio::ip::tcp;

// Bytes a client may send ahead (pipelined requests) while its current
// request is being answered; beyond this, disconnects are no longer
// watched until the next request is parsed.
constexpr size_t kMaxReadAhead = 64 * 1024;
constexpr size_t kReadChunk = 4096;
constexpr auto kLingerTimeout = std::chrono::seconds(5);

bool IsParseError(const beast::error_code& ec) {
  return ec.category() ==
             bhttp::make_error_code(bhttp::error::bad_target).category() &&
         ec != bhttp::error::end_of_stream &&
         ec != bhttp::error::partial_message;
}

}  // namespace

void SessionHome::Shutdown() {
  shutter_.store(std::this_thread::get_id());
  {
    absl::WriterMutexLock lock(&mu_);
    io.shutdown();
  }
  shutter_.store(std::thread::id());
}

GatedExchange::~GatedExchange() {
  home_->Guarded([this] { session_.reset(); });
}

void GatedExchange::Respond(int status, std::string content_type,
                            std::string body, HttpHeaders headers) {
  home_->Guarded([&] {
    session_->Respond(status, std::move(content_type), std::move(body),
                      std::move(headers));
  });
}

void GatedExchange::StartStream(int status, std::string content_type) {
  home_->Guarded(
      [&] { session_->StartStream(status, std::move(content_type)); });
}

void GatedExchange::Write(std::string data) {
  home_->Guarded([&] { session_->Write(std::move(data)); });
}

void GatedExchange::EndStream() {
  home_->Guarded([&] { session_->EndStream(); });
}

void GatedExchange::SetOnDisconnect(std::function<void()> callback) {
  home_->Guarded([&] { session_->SetOnDisconnect(std::move(callback)); });
}

template <typename Stream>
HttpSession<Stream>::HttpSession(Stream stream,
                                 std::shared_ptr<SessionHome> home,
                                 std::shared_ptr<asio::ssl::context> tls)
    : home_(std::move(home)),
      tls_(std::move(tls)),
      stream_(std::move(stream)) {}

template <typename Stream>
HttpSession<Stream>::~HttpSession() {
  SetState(State::kClosed);
}

template <typename Stream>
void HttpSession<Stream>::SetState(State state) {
  auto busy = [](State s) {
    return s == State::kHandling || s == State::kFlushing;
  };
  if (busy(state) && !busy(state_)) busy_.fetch_add(1);
  if (!busy(state) && busy(state_)) busy_.fetch_sub(1);
  state_ = state;
}

template <typename Stream>
template <typename F>
void HttpSession<Stream>::OnStrand(F&& f) {
  asio::post(stream_.get_executor(),
             [self = this->shared_from_this(),
              f = std::forward<F>(f)]() mutable { f(); });
}

template <typename Stream>
void HttpSession<Stream>::Run() {
  asio::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      self->DoRead();
    } else {
      // A client that never finishes its handshake is dropped after the
      // read timeout, as one that never sends a request is.
      self->Lowest().expires_after(
          absl::ToChronoNanoseconds(self->options_.read_timeout));
      self->stream_.async_handshake(asio::ssl::stream_base::server,
                                    [self](beast::error_code ec) {
                                      if (ec) return self->Close();
                                      self->DoRead();
                                    });
    }
  });
}

template <typename Stream>
void HttpSession<Stream>::DoRead() {
  SetState(State::kReading);
  parser_.emplace();
  parser_->body_limit(static_cast<uint64_t>(options_.max_body_bytes));
  Lowest().expires_after(absl::ToChronoNanoseconds(options_.read_timeout));
  bhttp::async_read_header(
      stream_, buffer_, *parser_,
      [self = this->shared_from_this()](beast::error_code ec, size_t) {
        self->OnHeader(ec);
      });
}

template <typename Stream>
void HttpSession<Stream>::OnHeader(beast::error_code ec) {
  if (ec || state_ == State::kClosed) return OnRead(ec);
  // curl sends "Expect: 100-continue" with bodies over 1 KiB and waits a
  // second for this before sending the body.
  if (beast::iequals(parser_->get()[bhttp::field::expect], "100-continue")) {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    asio::async_write(
        stream_, asio::buffer(kContinue),
        [self = this->shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->Close();
          self->ReadBody();
        });
    return;
  }
  ReadBody();
}

template <typename Stream>
void HttpSession<Stream>::ReadBody() {
  bhttp::async_read(stream_, buffer_, *parser_,
                    [self = this->shared_from_this()](
                        beast::error_code ec, size_t) { self->OnRead(ec); });
}

template <typename Stream>
void HttpSession<Stream>::OnRead(beast::error_code ec) {
  if (state_ == State::kClosed) return;
  if (ec == bhttp::error::body_limit) {
    return Reject(
        413,
        absl::StrCat("request body is larger than the limit of ",
                     options_.max_body_bytes, " bytes (--http_max_body_bytes)"),
        "request_too_large");
  }
  if (ec == bhttp::error::header_limit) {
    return Reject(431, "request headers are too large", "headers_too_large");
  }
  if (IsParseError(ec)) {
    return Reject(400, absl::StrCat("malformed HTTP request: ", ec.message()),
                  "bad_request");
  }
  if (ec) return Close();  // closed, reset or timed out between requests
  Lowest().expires_never();
  bhttp::request<bhttp::string_body> message = parser_->release();
  parser_.reset();
  version_ = message.version();
  keep_alive_ = message.keep_alive();
  chunked_ = false;
  HttpRequest request;
  request.method = std::string(message.method_string());
  const absl::string_view target(message.target().data(),
                                 message.target().size());
  request.path = std::string(target.substr(0, target.find('?')));
  request.body = std::move(message.body());
  if (auto it = message.find(bhttp::field::authorization);
      it != message.end()) {
    request.authorization = std::string(it->value());
  }
  SetState(State::kHandling);
  Watch();
  handler_(std::move(request),
           std::make_shared<GatedExchange>(this->shared_from_this(), home_));
}

template <typename Stream>
void HttpSession<Stream>::Reject(int status, const std::string& message,
                                 const std::string& code) {
  parser_.reset();
  Lowest().expires_never();
  keep_alive_ = false;
  linger_ = true;
  version_ = 11;
  SetState(State::kHandling);
  HttpError error = MakeHttpError(status, message, code);
  Respond(error.status, "application/json", std::move(error.body), {});
}

template <typename Stream>
void HttpSession<Stream>::Watch() {
  if (watching_ || state_ == State::kClosed) return;
  if (state_ != State::kLingering && buffer_.size() >= kMaxReadAhead) return;
  watching_ = true;
  stream_.async_read_some(
      buffer_.prepare(kReadChunk),
      [self = this->shared_from_this()](beast::error_code ec, size_t bytes) {
        self->OnWatch(ec, bytes);
      });
}

template <typename Stream>
void HttpSession<Stream>::OnWatch(beast::error_code ec, size_t bytes) {
  watching_ = false;
  if (state_ == State::kClosed) return;
  if (state_ == State::kLingering) {
    if (ec) return Close();  // the client closed, or the linger timed out
    return Watch();          // nothing committed: the bytes are dropped
  }
  // OnWrite cancelled the watch to parse a request that is already buffered.
  if (ec == asio::error::operation_aborted && state_ == State::kReading) {
    return DoRead();
  }
  if (ec) {
    ClientGone();
    return Close();
  }
  buffer_.commit(bytes);
  if (state_ == State::kReading) return DoRead();
  Watch();
}

template <typename Stream>
void HttpSession<Stream>::Respond(int status, std::string content_type,
                                  std::string body, HttpHeaders headers) {
  OnStrand([this, status, content_type = std::move(content_type),
            body = std::move(body), headers = std::move(headers)]() mutable {
    if (state_ != State::kHandling) return;
    bhttp::response<bhttp::string_body> res;
    res.version(version_);
    res.result(static_cast<unsigned>(status));
    res.set(bhttp::field::server, "baton");
    res.set(bhttp::field::content_type, content_type);
    for (auto& [name, value] : headers) res.set(name, value);
    res.keep_alive(keep_alive_);
    res.body() = std::move(body);
    res.prepare_payload();
    std::ostringstream out;
    out << res;
    Enqueue(std::move(out).str());
    ResponseComplete();
  });
}

template <typename Stream>
void HttpSession<Stream>::StartStream(int status, std::string content_type) {
  OnStrand([this, status, content_type = std::move(content_type)] {
    if (state_ != State::kHandling) return;
    chunked_ = version_ >= 11;
    // HTTP/1.0 has no chunks: the body ends when the connection closes.
    if (!chunked_) keep_alive_ = false;
    bhttp::response<bhttp::empty_body> res;
    res.version(version_);
    res.result(static_cast<unsigned>(status));
    res.set(bhttp::field::server, "baton");
    res.set(bhttp::field::content_type, content_type);
    res.set(bhttp::field::cache_control, "no-cache");
    res.keep_alive(keep_alive_);
    if (chunked_) res.chunked(true);
    std::ostringstream out;
    out << res.base();
    Enqueue(std::move(out).str());
  });
}

template <typename Stream>
void HttpSession<Stream>::Write(std::string data) {
  OnStrand([this, data = std::move(data)]() mutable {
    if (state_ != State::kHandling || data.empty()) return;
    if (chunked_) {
      Enqueue(absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"));
    } else {
      Enqueue(std::move(data));
    }
  });
}

template <typename Stream>
void HttpSession<Stream>::EndStream() {
  OnStrand([this] {
    if (state_ != State::kHandling) return;
    if (chunked_) Enqueue("0\r\n\r\n");
    ResponseComplete();
  });
}

template <typename Stream>
void HttpSession<Stream>::SetOnDisconnect(std::function<void()> callback) {
  OnStrand([this, callback = std::move(callback)]() mutable {
    if (gone_) {
      callback();
    } else if (state_ == State::kHandling) {
      on_disconnect_ = std::move(callback);
    }
  });
}

template <typename Stream>
void HttpSession<Stream>::Enqueue(std::string bytes) {
  queue_.push_back(std::move(bytes));
  DoWrite();
}

template <typename Stream>
void HttpSession<Stream>::DoWrite() {
  if (writing_ || queue_.empty() || state_ == State::kClosed) return;
  writing_ = true;
  std::vector<asio::const_buffer> buffers;
  while (!queue_.empty()) {
    in_flight_.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  for (const std::string& s : in_flight_) buffers.push_back(asio::buffer(s));
  asio::async_write(stream_, buffers,
                    [self = this->shared_from_this()](
                        beast::error_code ec, size_t) { self->OnWrite(ec); });
}

template <typename Stream>
void HttpSession<Stream>::OnWrite(beast::error_code ec) {
  writing_ = false;
  in_flight_.clear();
  if (state_ == State::kClosed) return;
  if (ec) {
    ClientGone();
    return Close();
  }
  if (!queue_.empty()) return DoWrite();
  if (state_ != State::kFlushing) return;
  if (!keep_alive_) return linger_ ? Linger() : Close();
  SetState(State::kReading);
  if (!watching_) return DoRead();
  // The next request (pipelined, or sent as soon as the response arrived)
  // may already be buffered while the watch waits for bytes that will not
  // come: cancel the watch, and OnWatch starts parsing.
  if (buffer_.size() > 0) {
    beast::error_code ignored;
    Lowest().socket().cancel(ignored);
  }
}

template <typename Stream>
void HttpSession<Stream>::ResponseComplete() {
  on_disconnect_ = nullptr;
  SetState(State::kFlushing);
  // OnWrite moves on once the queue has drained.
}

template <typename Stream>
void HttpSession<Stream>::ClientGone() {
  gone_ = true;
  if (on_disconnect_) {
    std::function<void()> callback = std::move(on_disconnect_);
    on_disconnect_ = nullptr;
    callback();
  }
}

template <typename Stream>
void HttpSession<Stream>::Linger() {
  beast::error_code ignored;
  Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
  SetState(State::kLingering);
  Lowest().expires_after(kLingerTimeout);
  Watch();
}

template <typename Stream>
void HttpSession<Stream>::Close() {
  if (state_ == State::kClosed) return;
  SetState(State::kClosed);
  on_disconnect_ = nullptr;
  queue_.clear();
  beast::error_code ignored;
  Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
  Lowest().close();
}

template class HttpSession<beast::tcp_stream>;
template class HttpSession<beast::ssl_stream<beast::tcp_stream>>;

}  // namespace baton::http
