# Included by the top-level CMakeLists.txt in a BATON_SANITIZE=thread build:
# every program links baton_tsan_absl, and the linker routes our calls to
# the Abseil synchronization functions below through its wrappers (see
# absl_sync_annotations.cc for why).
set(_baton_tsan_wrapped
  _ZN4absl7debian35Mutex4LockEv
  _ZN4absl7debian35Mutex6UnlockEv
  _ZN4absl7debian35Mutex10ReaderLockEv
  _ZN4absl7debian35Mutex12ReaderUnlockEv
  _ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE
  _ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE
  _ZN4absl7debian312Notification6NotifyEv
  _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE
  _ZNK4absl7debian312Notification19WaitForNotificationEv)
add_library(baton_tsan_absl STATIC ${CMAKE_CURRENT_LIST_DIR}/absl_sync_annotations.cc)
target_include_directories(baton_tsan_absl PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(baton_tsan_absl PUBLIC absl::synchronization)
# --undefined pulls the wrappers out of the archive in every program, also in
# one that takes no lock itself (the shared Abseil libraries it links still
# call the wrapped functions, and the linker routes those calls too).
foreach(_symbol IN LISTS _baton_tsan_wrapped)
  add_link_options(-Wl,--wrap=${_symbol} -Wl,--undefined=__wrap_${_symbol})
endforeach()
link_libraries(baton_tsan_absl)
# Boost.Asio orders handler memory with std::atomic_thread_fence, which TSan
# does not model (GCC rejects it under -fsanitize=thread); without fenced
# blocks the ordering comes from the scheduler's mutex, which TSan sees.
add_compile_definitions(BOOST_ASIO_DISABLE_FENCED_BLOCK)
