#include "worker/kv_cache/block_table.h"

#include <utility>

#include "common/check.h"

namespace baton {

BlockTable::BlockTable(BlockTable&& other) noexcept
    : block_ids_(std::move(other.block_ids_)),
      num_tokens_(std::exchange(other.num_tokens_, 0)),
      pool_id_(std::exchange(other.pool_id_, 0)) {
  other.block_ids_.clear();
}

BlockTable& BlockTable::operator=(BlockTable&& other) noexcept {
  if (this == &other) return *this;
  BATON_CHECK(block_ids_.empty())
      << "move-assigning onto a BlockTable that still holds "
      << block_ids_.size() << " blocks";
  block_ids_ = std::move(other.block_ids_);
  other.block_ids_.clear();
  num_tokens_ = std::exchange(other.num_tokens_, 0);
  pool_id_ = std::exchange(other.pool_id_, 0);
  return *this;
}

}  // namespace baton
