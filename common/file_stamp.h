// What identifies files' contents cheaply, for reloading them when they
// change: inode, size and modification time of each.
#ifndef BATON_COMMON_FILE_STAMP_H_
#define BATON_COMMON_FILE_STAMP_H_

#include <initializer_list>
#include <string>

namespace baton {

// One string for the named files; empty names and files that cannot be
// stat'ed add nothing. A file replaced (renamed over) or rewritten changes
// it.
std::string FilesStamp(std::initializer_list<const std::string*> paths);

}  // namespace baton

#endif  // BATON_COMMON_FILE_STAMP_H_
