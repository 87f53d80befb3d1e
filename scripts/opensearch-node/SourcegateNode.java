/*
 * Starts ONE OpenSearch node in this JVM with plugins taken from the classpath (the way
 * OpenSearch's own MockNode does), so a test node needs only Maven Central jars.
 *
 * Run in Java's source-file mode (no build step):
 *   java -cp '<lib>/*:<knn>/*' SourcegateNode.java <path.home> <pid file> <plugin class>...
 *
 * Settings come from <path.home>/config/opensearch.yml (written by scripts/opensearch),
 * logging from <path.home>/config/log4j2.properties. No security plugin, no bootstrap
 * checks: for local tests only.
 */
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.codelibs.opensearch.runner.node.OpenSearchRunnerNode;
import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;

public final class SourcegateNode {

    public static void main(final String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: SourcegateNode <path.home> <pid file> <plugin class>...");
            System.exit(2);
        }
        final Path home = Paths.get(args[0]).toAbsolutePath();
        final Path pidFile = Paths.get(args[1]).toAbsolutePath();
        final Path conf = home.resolve("config");

        final Settings input = Settings.builder().put("path.home", home.toString()).build();
        final Environment env =
                InternalSettingsPreparer.prepareEnvironment(input, Collections.emptyMap(), conf, () -> "sourcegate");
        LogConfigurator.registerErrorListener();
        LogConfigurator.configure(env);
        Files.createDirectories(env.modulesFile());
        Files.createDirectories(env.pluginsFile());

        final List<Class<? extends Plugin>> plugins = new ArrayList<>();
        for (int i = 2; i < args.length; i++) {
            try {
                plugins.add(Class.forName(args[i]).asSubclass(Plugin.class));
            } catch (final ClassNotFoundException e) {
                System.err.println("plugin class not on the classpath, skipped: " + args[i]);
            }
        }

        final Node node = new OpenSearchRunnerNode(env, plugins);
        final CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(30, TimeUnit.SECONDS);
            } catch (final Exception e) {
                e.printStackTrace();
            } finally {
                closed.countDown();
            }
        }, "sourcegate-node-shutdown"));

        Files.write(pidFile, (ProcessHandle.current().pid() + "\n").getBytes(StandardCharsets.US_ASCII));
        try {
            node.start();
        } catch (final Exception e) {
            e.printStackTrace();
            System.exit(1);
        }
        System.out.println("sourcegate node started");
        closed.await(); // keep the JVM alive until SIGTERM/SIGINT closes the node
    }
}
