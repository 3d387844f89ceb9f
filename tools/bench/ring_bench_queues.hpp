// The queues of `proxyep bench ring` behind one shape, so every measurement runs the same code
// over each: Queue(config), Queue::Producer(queue, id).try_push(descriptor),
// Queue::Consumer(queue).pop(span). Every producer encodes (check word included) and every
// consumer receives 64-byte WireDescriptors, which the benchmark decodes. The queues: the ring in
// its multi-producer mode ("ring"), the ring in its single-producer mode ("ring_spsc", one
// producer only), and moodycamel::ConcurrentQueue.
#pragma once

#include "common/host_memory.hpp"
#include "gpu_side/descriptor.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"

#include <concurrentqueue/concurrentqueue.h>

#include <span>
#include <vector>

namespace proxyep::tools::ring_bench {

struct QueueConfig {
  uint64_t capacity;
  int producers;
  bool spsc_fence;  // ring_spsc: a locked exchange per publish (no membarrier)
};

// The ring in `Mode`. Producers get a doorbell, as a proxy's do, so every push pays the
// doorbell check it pays in production (the consumer here never sleeps, so nobody kicks).
template <gpu_side::ProducerMode Mode>
class RingQueue {
 public:
  static constexpr const char* kName =
      Mode == gpu_side::ProducerMode::single ? "ring_spsc" : "ring";

  explicit RingQueue(const QueueConfig& config)
      : memory_(HostMemory::heap(gpu_side::Ring::bytes_for(config.capacity))),
        ring_(gpu_side::Ring::create(memory_.bytes(), config.capacity, Mode)),
        fence_(config.spsc_fence) {}

  class Producer {
   public:
    Producer(RingQueue& queue, int /*id*/)
        : producer_(queue.ring_,
                    {.doorbell = &queue.doorbell_, .fence_per_publish = queue.fence_}) {}
    bool try_push(const gpu_side::Descriptor& d) { return producer_.try_push(d) == Status::ok; }
    // Pushes a prefix of `batch` with one reservation; returns how many.
    size_t try_push_burst(std::span<const gpu_side::Descriptor> batch) {
      size_t pushed = 0;
      (void)producer_.try_push_burst(batch,
                                     pushed);  // again: 0 pushed; no timeout with a live consumer
      return pushed;
    }

   private:
    gpu_side::RingProducer producer_;
  };

  class Consumer {
   public:
    explicit Consumer(RingQueue& queue) : consumer_(queue.ring_) {}
    size_t pop(std::span<gpu_side::WireDescriptor> out) { return consumer_.pop_burst(out); }

   private:
    gpu_side::RingConsumer consumer_;
  };

 private:
  HostMemory memory_;
  gpu_side::Ring ring_;
  gpu_side::Doorbell doorbell_;
  bool fence_;
};

using MpscRingQueue = RingQueue<gpu_side::ProducerMode::multi>;
using SpscRingQueue = RingQueue<gpu_side::ProducerMode::single>;

// moodycamel::ConcurrentQueue used at its best: explicit producer and consumer tokens, bulk
// dequeue, memory preallocated for `capacity` elements per producer. Producers use enqueue(),
// which allocates another block when the preallocated ones are taken: try_enqueue() (no
// allocation) is not usable with several producers, because an explicit producer keeps every
// block it ever took, so a fast one can take the whole pool and starve the others for good.
// Unlike the ring, the queue is therefore unbounded.
class MoodycamelQueue {
 public:
  static constexpr const char* kName = "moodycamel";
  using Queue = moodycamel::ConcurrentQueue<gpu_side::WireDescriptor>;

  explicit MoodycamelQueue(const QueueConfig& config)
      : queue_(config.capacity, static_cast<size_t>(config.producers), 0) {}

  class Producer {
   public:
    Producer(MoodycamelQueue& queue, int /*id*/) : queue_(queue.queue_), token_(queue.queue_) {}
    bool try_push(const gpu_side::Descriptor& d) {
      // The same image the ring publishes; the sequence word is the producer's own count.
      if (!queue_.enqueue(token_, gpu_side::encode(d, sequence_ + 1))) return false;
      ++sequence_;
      return true;
    }
    // Encodes `batch` and enqueues it with one enqueue_bulk; all or nothing.
    size_t try_push_burst(std::span<const gpu_side::Descriptor> batch) {
      images_.resize(batch.size());
      for (size_t i = 0; i < batch.size(); ++i)
        images_[i] = gpu_side::encode(batch[i], sequence_ + 1 + i);
      if (!queue_.enqueue_bulk(token_, images_.data(), images_.size())) return 0;
      sequence_ += batch.size();
      return batch.size();
    }

   private:
    Queue& queue_;
    moodycamel::ProducerToken token_;
    uint64_t sequence_ = 0;
    std::vector<gpu_side::WireDescriptor> images_;
  };

  class Consumer {
   public:
    explicit Consumer(MoodycamelQueue& queue) : queue_(queue.queue_), token_(queue.queue_) {}
    size_t pop(std::span<gpu_side::WireDescriptor> out) {
      return queue_.try_dequeue_bulk(token_, out.data(), out.size());
    }

   private:
    Queue& queue_;
    moodycamel::ConsumerToken token_;
  };

 private:
  Queue queue_;
};

}  // namespace proxyep::tools::ring_bench
