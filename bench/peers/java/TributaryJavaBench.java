// The Tributary producer experiments through Java stubs generated from protos/ (grpc-java).
//
// Built and run by bench/peers/tributary_java.py: protoc + protoc-gen-grpc-java generate the
// dev.tributary.v1 classes from protos/tributary/v1/*.proto, javac compiles them with this file.
//
//   java TributaryJavaBench <host:port> <topic> <warmup-topic> <unbatched|batched> <count> <acks 0|1|all> <in-flight>
//
// unbatched: one typed ProduceRecord per ProduceRequest on ProduceStream, <in-flight> requests
// outstanding; batched: 50 records per ProduceRequest. The payloads are bench/peers message(i):
// "%012d|" + 188 bytes (33 + (i*31 + j*7) % 90). With acks=0 the clock stops when ListOffsets
// reports the topic's end offset at <count>. Prints "S <seconds> <acknowledged>" progress samples
// and a final "DONE <seconds> <count> <requests>".
import dev.tributary.v1.Acks;
import dev.tributary.v1.GatewayGrpc;
import dev.tributary.v1.GetMetadataRequest;
import dev.tributary.v1.ListOffsetsPartition;
import dev.tributary.v1.ListOffsetsRequest;
import dev.tributary.v1.OffsetSpec;
import dev.tributary.v1.ProduceRecord;
import dev.tributary.v1.ProduceRequest;
import dev.tributary.v1.ProduceResponse;
import com.google.protobuf.ByteString;
import io.grpc.ManagedChannel;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.StreamObserver;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

public final class TributaryJavaBench {
    static final int MESSAGE_BYTES = 200;
    static final int BATCH = 50;

    static ByteString message(long i) {
        byte[] out = new byte[MESSAGE_BYTES];
        byte[] head = String.format("%012d|", i).getBytes(StandardCharsets.US_ASCII);
        System.arraycopy(head, 0, out, 0, head.length);
        for (int j = 0; j < MESSAGE_BYTES - head.length; j++) {
            out[head.length + j] = (byte) (33 + (i * 31 + j * 7) % 90);
        }
        return ByteString.copyFrom(out);
    }

    static Acks acks(String value) {
        switch (value) {
            case "0": return Acks.ACKS_NONE;
            case "1": return Acks.ACKS_LEADER;
            default: return Acks.ACKS_ALL;
        }
    }

    static long endOffset(GatewayGrpc.GatewayBlockingStub stub, String topic) {
        return stub.listOffsets(ListOffsetsRequest.newBuilder().addPartitions(ListOffsetsPartition.newBuilder()
                .setTopic(topic).setPartition(0).setSpec(OffsetSpec.newBuilder().setLatest(true))).build())
                .getPartitions(0).getOffset();
    }

    /** Sends count records (perRequest per request, window requests outstanding); returns requests sent. */
    static long run(GatewayGrpc.GatewayStub async, String topic, long count, int perRequest, Acks acks, int window,
                    long firstIndex, boolean report, long t0) throws Exception {
        Semaphore slots = new Semaphore(window);
        AtomicLong acked = new AtomicLong();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        CountDownLatch finished = new CountDownLatch(1);
        long requests = (count + perRequest - 1) / perRequest;
        AtomicLong answered = new AtomicLong();
        long step = Math.max(1, count / 400);
        AtomicLong nextReport = new AtomicLong(step);
        StreamObserver<ProduceResponse> responses = new StreamObserver<>() {
            @Override public void onNext(ProduceResponse response) {
                for (var p : response.getPartitionsList()) {
                    if (p.hasError() && !p.getError().getReason().isEmpty()) {
                        failure.compareAndSet(null, new RuntimeException(p.getError().toString()));
                    }
                }
                long done = acked.addAndGet(perRequest);
                if (report && done >= nextReport.get()) {
                    nextReport.set(done + step);
                    System.out.println("S " + (System.nanoTime() - t0) / 1e9 + " " + Math.min(done, count));
                }
                slots.release();
                if (answered.incrementAndGet() == requests) finished.countDown();
            }
            @Override public void onError(Throwable t) { failure.compareAndSet(null, t); finished.countDown(); slots.release(window); }
            @Override public void onCompleted() { finished.countDown(); }
        };
        StreamObserver<ProduceRequest> stream = async.produceStream(responses);
        long sent = 0;
        for (long r = 0; r < requests && failure.get() == null; r++) {
            ProduceRequest.Builder request = ProduceRequest.newBuilder().setTopic(topic).setAcks(acks)
                    .setTimeoutMs(30000).setCorrelationId(r);
            for (int k = 0; k < perRequest && sent < count; k++, sent++) {
                request.addRecords(ProduceRecord.newBuilder().setValue(message(firstIndex + sent)).setPartition(0));
            }
            slots.acquire();
            stream.onNext(request.build());
        }
        if (!finished.await(600, TimeUnit.SECONDS)) throw new RuntimeException("timed out waiting for responses");
        stream.onCompleted();
        if (failure.get() != null) throw new RuntimeException(failure.get());
        return requests;
    }

    public static void main(String[] args) throws Exception {
        String target = args[0], topic = args[1], warmupTopic = args[2], mode = args[3];
        long count = Long.parseLong(args[4]);
        Acks acks = acks(args[5]);
        int window = Integer.parseInt(args[6]);
        int perRequest = mode.equals("batched") ? BATCH : 1;
        ManagedChannel channel = NettyChannelBuilder.forTarget(target).usePlaintext()
                .maxInboundMessageSize(64 << 20).build();
        try {
            GatewayGrpc.GatewayStub async = GatewayGrpc.newStub(channel);
            GatewayGrpc.GatewayBlockingStub blocking = GatewayGrpc.newBlockingStub(channel);
            blocking.getMetadata(GetMetadataRequest.newBuilder().addTopics(topic).build());
            // JIT warm-up on another topic: the same code path, not measured.
            run(async, warmupTopic, Math.min(count, 5000), perRequest, acks, window, 0, false, System.nanoTime());
            long t0 = System.nanoTime();
            System.out.println("START");
            long requests = run(async, topic, count, perRequest, acks, window, 0, true, t0);
            if (acks == Acks.ACKS_NONE) {
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
                while (endOffset(blocking, topic) < count && System.nanoTime() < deadline) Thread.sleep(2);
            }
            double seconds = (System.nanoTime() - t0) / 1e9;
            System.out.println("DONE " + seconds + " " + count + " " + requests);
        } finally {
            channel.shutdownNow().awaitTermination(10, TimeUnit.SECONDS);
        }
    }
}
