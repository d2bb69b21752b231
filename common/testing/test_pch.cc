// The owner of the tests' precompiled headers (CMakeLists.txt:
// baton_test_pch); every baton_test reuses them.
int main() { return 0; }
