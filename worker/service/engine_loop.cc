#include "worker/service/engine_loop.h"

namespace baton {

EngineLoop::EngineLoop(Engine* engine, absl::Duration idle_poll)
    : engine_(engine), idle_poll_(idle_poll), thread_([this] { Run(); }) {
  engine_->SetWakeup([this] { Wake(); });
}

EngineLoop::~EngineLoop() {
  engine_->SetWakeup(nullptr);
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void EngineLoop::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

void EngineLoop::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      woken_ = false;
    }
    if (engine_->Step()) continue;
    // Time-driven work needs a live request or handoff; without one, only
    // a wake (new work) matters, and the long poll just bounds a missed one.
    const absl::Duration poll =
        engine_->HasWork() ? idle_poll_ : absl::Seconds(1);
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return woken_ || stop_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), poll);
  }
}

}  // namespace baton
