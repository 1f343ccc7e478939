// Tasks [0, count) shared by the intra-op threads in contiguous runs, one a thread, as
// at::parallel_for would split them; each thread takes its own run's tasks from the front,
// and once its run is done, the other runs' last tasks from their back. The runs keep a
// thread's tasks where at::parallel_for put them (on the core that wrote their input in
// the layer before, which split alike); taking from the back evens out what two cores of
// unequal speed at the moment (another tenant, a colder cache) would otherwise leave one
// thread waiting for at the pool's barrier.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace blade::ral {

class TaskRuns {
 public:
  TaskRuns(int64_t count, int64_t runs)
      : runs_(std::max<int64_t>(1, std::min(runs, count))),
        ends_(new Ends[static_cast<size_t>(runs_)]) {
    TORCH_CHECK(count >= 0 && count < (int64_t{1} << 32),
                "TaskRuns: a count of tasks in [0, 2^32) expected, got ", count);
    for (int64_t r = 0; r < runs_; ++r) {
      // at::parallel_for's split: runs of ceil(count / runs), the last ones shorter.
      const int64_t size = (count + runs_ - 1) / runs_;
      const int64_t front = std::min(count, r * size), back = std::min(count, front + size);
      ends_[r].packed.store(pack(front, back), std::memory_order_relaxed);
    }
  }
  int64_t runs() const { return runs_; }

  // The next task of the thread that owns run `self`: its run's front, else the back of
  // the first other run that has tasks left; false once no run has any. `end` is the end
  // of the tasks the thread takes next in order (the task after it is its next one, if
  // below `end`), so that it may fetch that task's data ahead: for a task taken from
  // another run's back, the task itself plus one (nothing ahead).
  bool next(int64_t self, int64_t& task, int64_t& end) {
    uint64_t ends = ends_[self].packed.load(std::memory_order_relaxed);
    while (front(ends) < back(ends)) {
      if (ends_[self].packed.compare_exchange_weak(ends, pack(front(ends) + 1, back(ends)),
                                                   std::memory_order_relaxed)) {
        task = front(ends);
        end = back(ends);
        return true;
      }
    }
    for (int64_t step = 1; step < runs_; ++step) {
      Ends& other = ends_[(self + step) % runs_];
      ends = other.packed.load(std::memory_order_relaxed);
      while (front(ends) < back(ends)) {
        if (other.packed.compare_exchange_weak(ends, pack(front(ends), back(ends) - 1),
                                               std::memory_order_relaxed)) {
          task = back(ends) - 1;
          end = task + 1;
          return true;
        }
      }
    }
    return false;
  }

 private:
  // A run's front and back in one word, so that the owner's and a thief's claims never
  // take the same task (counts of tasks stay far below 2^32).
  struct alignas(64) Ends {
    std::atomic<uint64_t> packed{0};
  };
  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) | (static_cast<uint64_t>(back) << 32);
  }
  static int64_t front(uint64_t ends) { return static_cast<int64_t>(ends & 0xFFFFFFFFu); }
  static int64_t back(uint64_t ends) { return static_cast<int64_t>(ends >> 32); }

  int64_t runs_;
  std::unique_ptr<Ends[]> ends_;
};

// `body(take)` on `threads` of the intra-op threads (all by default), where `take(task,
// end)` hands it tasks of [0, count) (TaskRuns::next) until it returns false; every task
// runs exactly once. On one thread, inline.
template <typename Body>
void run_task_runs(int64_t count, const Body& body, int64_t threads = at::get_num_threads()) {
  if (count <= 0) {
    return;
  }
  TaskRuns runs(count, threads);
  at::parallel_for(0, runs.runs(), 1, [&](int64_t first_run, int64_t /*end*/) {
    body([&](int64_t& task, int64_t& end) { return runs.next(first_run, task, end); });
  });
}

}  // namespace blade::ral
