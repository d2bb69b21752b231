#include "common/file_stamp.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"

namespace baton {

std::string FilesStamp(std::initializer_list<const std::string*> paths) {
  std::string stamp;
  for (const std::string* path : paths) {
    struct stat st {};
    if (!path->empty() && stat(path->c_str(), &st) == 0) {
      absl::StrAppend(&stamp, st.st_ino, ":", st.st_size, ":",
                      st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ";");
    }
  }
  return stamp;
}

}  // namespace baton
