// Clang thread-safety annotations (https://clang.llvm.org/docs/
// ThreadSafetyAnalysis.html), as leveldb's port/thread_annotations.h: they
// expand to nothing for other compilers. The analysis runs in CI
// (run_tests.sh, "thread-safety" stage: clang++ -fsyntax-only
// -Wthread-safety -Werror over the annotated files), on members declared
// GUARDED_BY an asyncps::Mutex (common/mutex.h) and functions that say
// REQUIRES / EXCLUDES.
#pragma once

#if defined(__clang__)
#define ASYNCPS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define ASYNCPS_THREAD_ANNOTATION(x)
#endif

#ifndef GUARDED_BY
#define GUARDED_BY(x) ASYNCPS_THREAD_ANNOTATION(guarded_by(x))
#endif
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) ASYNCPS_THREAD_ANNOTATION(pt_guarded_by(x))
#endif
#ifndef REQUIRES
#define REQUIRES(...) \
  ASYNCPS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#endif
#ifndef EXCLUDES
#define EXCLUDES(...) ASYNCPS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#endif
#ifndef ACQUIRE
#define ACQUIRE(...) ASYNCPS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) ASYNCPS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#endif
#ifndef CAPABILITY
#define CAPABILITY(x) ASYNCPS_THREAD_ANNOTATION(capability(x))
#endif
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY ASYNCPS_THREAD_ANNOTATION(scoped_lockable)
#endif
#ifndef ASSERT_CAPABILITY
#define ASSERT_CAPABILITY(x) ASYNCPS_THREAD_ANNOTATION(assert_capability(x))
#endif
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS \
  ASYNCPS_THREAD_ANNOTATION(no_thread_safety_analysis)
#endif
