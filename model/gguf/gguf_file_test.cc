#include "model/gguf/gguf_file.h"
#include "gtest/gtest.h"
TEST(GgufFileTest, Placeholder) {}
