import Logging

/// `admin.token_file` rotated under a running relay (a Kubernetes Secret update, a vault agent): the
/// admin listener takes the new token without a restart, so an operator who rotates a leaked token does
/// not have to restart the relay (and its held requests) to lock the old one out. The path itself is a
/// restart-only setting (`ConfigReload`); its content is not.
extension Relay {
    func watchAdminToken() {
        guard let path = config.admin?.tokenFile, admin != nil else { return }
        adminTokenWatch = FileChangeWatch(path: path, loop: loop, interval: config.tokens.watchIntervalSeconds) { [unowned self] in
            self.adminTokenFileChanged(path: path)
        }
    }

    /// A file that cannot be used (unreadable, empty, white space inside) keeps the token in use: a
    /// half-written file must not open `/status` and `POST /refresh` nor lock every operator out.
    func adminTokenFileChanged(path: String) {
        do {
            let token = try AdminBearerToken.load(path: path)
            redactor.add(token.text)
            admin?.bearerToken = token
            logger.info("admin token file changed; /status and POST /refresh take the new token", metadata: ["file": "\(path)"])
        } catch {
            logger.error("ignoring changed admin token file; keeping the token in use", metadata: ["error": "\(error)"])
        }
    }
}
